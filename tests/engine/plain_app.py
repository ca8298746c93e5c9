"""The example engine on plain ``@hydra.main``: what an engine gets without ``hydra_app``.

python -m tests.engine.plain_app --help    # lists the deployments, the library's included
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mstar_resources import resolve
from mstar_resources.apps.hydra_app import register_options_resolver

register_options_resolver("engine")  # ${mstar_resources.options:deployment} in engine.yaml's help


@hydra.main(version_base="1.3", config_path="conf", config_name="engine")
def main(cfg: DictConfig) -> None:
    for record in resolve(cfg.resources):
        print(record.path, record.floor.mb, record.floor.source)


if __name__ == "__main__":
    main()
