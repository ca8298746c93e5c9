"""The apps: the dry run (``mstar-resources``), calibration's command line, and what every app of
the library is built on (``hydra_app``). Nothing in the core, the config layer or the engines'
plugins imports them."""
