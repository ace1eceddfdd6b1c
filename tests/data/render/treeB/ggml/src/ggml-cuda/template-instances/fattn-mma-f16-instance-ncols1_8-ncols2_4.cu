// empty stand-in (tests/data/render)
