#!/usr/bin/env bash
# Install Ansible (with its bundled collections: community.docker, kubernetes.core) and ansible-lint into their own
# venv, .tools/ansible-venv (a link into the cache of lib/cache.sh), so their many dependencies never clash with the
# toolkit's pins in .venv.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
# ansible 12.x is the newest line that supports Python 3.11; it bundles ansible-core 2.19.
pins=("ansible==12.3.0" "ansible-core==2.19.14" "ansible-lint==26.10.1")

build_ansible_venv() {
    new_venv 31-ansible.sh "$1"
    venv_install "$1" "${pins[@]}"
}

cached_venv ansible "${pins[*]} $GLM53_PIP_PIN" build_ansible_venv "$repo_root/.tools/ansible-venv"
venv="$CACHED_VENV"
for tool in ansible ansible-playbook ansible-galaxy ansible-doc ansible-lint; do
    link_tool "$venv/bin/$tool" "$tool"
done
"$tools_bin/ansible-playbook" --version >/dev/null \
    || { echo "31-ansible.sh: ansible-playbook in $venv does not run; delete $venv and re-run" >&2; exit 1; }
