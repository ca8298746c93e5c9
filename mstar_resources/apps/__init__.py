"""The apps (``mstar-resources``, calibration's command line) and ``hydra_app``, their base."""
