"""The apps: the dry run (``mstar-resources``), calibration's command line, and ``hydra_app``,
which both are built with. Nothing below them imports them."""
