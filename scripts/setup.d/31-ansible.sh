#!/usr/bin/env bash
# Install Ansible (with its bundled collections: community.docker, kubernetes.core) and ansible-lint into their own
# venv, .tools/ansible-venv, so their many dependencies never clash with the toolkit's pins in .venv.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$repo_root/.tools/ansible-venv"
python="${PYTHON:-python3.11}"
# ansible 12.x is the newest line that supports Python 3.11; it bundles ansible-core 2.19.
pins=("ansible==12.3.0" "ansible-core==2.19.14" "ansible-lint==26.10.1")
stamp="$venv/.glm53-pins"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${pins[*]}" ]; then
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==25.3"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
    printf '%s' "${pins[*]}" >"$stamp"
fi
mkdir -p "$repo_root/.tools/bin"
for tool in ansible ansible-playbook ansible-galaxy ansible-doc ansible-lint; do
    ln -sfn "$venv/bin/$tool" "$repo_root/.tools/bin/$tool"
done
