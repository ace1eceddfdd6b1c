"""What to try: search spaces (``space``), kernel constraints (``constraints``), variants and the value objects passed
between stages (``variant``), and rendering a candidate into CMake defines and a patch (``render``)."""
