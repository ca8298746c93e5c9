"""mstar-resources' config tree, served to Hydra as ``pkg://mstar_resources.conf``.

Importing it registers the schemas that its YAML types its nodes with.
"""

from mstar_resources import schema as _schema  # noqa: F401  (registers mstar_resources/resource)
from mstar_resources.calibration import profile as _profile  # noqa: F401  (registers ./calibration)
