"""mstar-resources' config tree, served to Hydra as ``pkg://mstar_resources.conf``.

Importing it (as Hydra does when the tree is on a search path) registers, in Hydra's ConfigStore,
the schemas its YAML types its nodes with: ``mstar_resources/resource`` and
``mstar_resources/calibration``. Nothing else registers them: the core and the resolver import no
Hydra.
"""

from hydra.core.config_store import ConfigStore

from mstar_resources.calibration.profile import PROFILE_KEY, CalibrationProfile
from mstar_resources.schema import Resource

SCHEMAS = {"resource": Resource, PROFILE_KEY: CalibrationProfile}
"""The schemas of the tree's nodes, by their names in the ConfigStore group ``mstar_resources``."""

for _name, _node in SCHEMAS.items():
    ConfigStore.instance().store(
        group="mstar_resources", name=_name, node=_node, provider="mstar-resources"
    )
