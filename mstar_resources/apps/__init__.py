"""The apps: the dry run (``mstar-resources``) and what every app of the library is built on
(``hydra_app``, the one-paragraph errors). Nothing in the core or the config layer imports them."""
