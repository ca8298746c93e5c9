"""The apps: the dry run (``mstar-resources``), calibration's and the replay's command lines, and
what every app of the library is built on (``hydra_app``). Nothing in the core or the config layer
imports them."""
