"""An engine's entry point: composes its config and prints the resolved resources as JSON
(``{"model": ..., "resources": [...]}``).

    python -m tests.engine.app deployment=llama3-70b-tp8-h200 resources.attn.decode.declared_mb=96

``hydra_app`` is ``@hydra.main`` with the library's error reporting: bad input, in the engine's
own settings or in the resource tree, ends in one paragraph on stderr and exit status 2.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig

from mstar_resources import resolve
from mstar_resources.apps.hydra_app import hydra_app


@hydra_app("engine", config_name="engine", config_path="conf", command="python -m tests.engine.app")
def main(cfg: DictConfig) -> None:
    records = resolve(cfg.resources)
    print(json.dumps({"model": cfg.model.name, "resources": [r.as_json() for r in records]}))


if __name__ == "__main__":
    main()
