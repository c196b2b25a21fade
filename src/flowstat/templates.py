"""The repository's generated files: the stores' set-up (index-templates/STORE/, from the schemas),
the dashboards, alert rules and provisioning (dashboards/: Grafana, Kibana and ElastAlert2, from
flowstat.views) and the Telegraf configuration for the compose stack (pipelines/telegraf/telegraf.conf,
a copy of the one flowstat stack runs). Written by ``python -m flowstat.templates --write`` from a
checkout; a test checks they are current."""

from __future__ import annotations

import sys
from pathlib import Path

from flowstat import stores
from flowstat.stack import elastalert as elastalert_service
from flowstat.stack import telegraf
from flowstat.views import elastalert, grafana, kibana

GENERATED_CONF_HEADER = ("# Generated from src/flowstat/stack/telegraf.conf by `python -m flowstat.templates --write`:\n"
                         "# edit that file. docker-compose.yml mounts this copy.\n")


def render_files(root: Path) -> dict[Path, str]:
    """Every generated file under the checkout ``root``, and its content."""
    out = {}
    for writer in stores.writers():
        for name, text in writer.setup_files().items():
            out[root / "index-templates" / writer.name / name] = text
    out[root / "pipelines" / "telegraf" / telegraf.CONFIG] = GENERATED_CONF_HEADER + telegraf.config_text()
    for name, text in grafana.files().items():
        out[root / "dashboards" / "grafana" / name] = text
    for name, text in kibana.files().items():
        out[root / "dashboards" / "kibana" / name] = text
    for name, text in elastalert_service.compose_rules().items():
        out[root / "dashboards" / "elastalert" / "rules" / name] = text
    out[root / "dashboards" / "elastalert" / "config.yaml"] = elastalert_service.compose_config_text()
    return out


def write_files(root: Path) -> list[Path]:
    written = []
    for path, text in render_files(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) > 3:
        print("usage: python -m flowstat.templates --write [CHECKOUT]   (default: the current directory)",
              file=sys.stderr)
        sys.exit(2)
    top = Path(sys.argv[2] if len(sys.argv) == 3 else ".")
    if not (top / "index-templates").is_dir():
        print(f"flowstat.templates: {top.resolve()} is not a flowstat checkout (no index-templates/)", file=sys.stderr)
        sys.exit(2)
    for p in write_files(top):
        print(p)
