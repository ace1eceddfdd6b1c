"""What a search leaves behind: the exported result folder (``export``), bench reports (``report``) and
checks of stored results (``validate``)."""
