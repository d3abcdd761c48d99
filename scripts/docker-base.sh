#!/usr/bin/env bash
# Builds a stand-in for the `python:3.11-slim` base image from Debian packages, for a machine
# whose Docker daemon cannot pull from a registry. Debian bookworm's python3 is 3.11, so the
# image the Dockerfile builds on it behaves like the one built on the official base.
#
#   sudo scripts/docker-base.sh [TAG]         # default tag: python:3.11-slim
#
# Needs root, debootstrap and a running Docker daemon (DOCKER_HOST is honoured).
# DEBIAN_MIRROR picks the mirror (debootstrap's default otherwise).
set -euo pipefail

tag=${1:-python:3.11-slim}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

# shellcheck disable=SC2086  # an unset mirror is no argument at all
debootstrap --variant=minbase bookworm "$root" ${DEBIAN_MIRROR:-} >&2
# debootstrap's --include does not resolve dependencies: apt inside the new root does.
chroot "$root" apt-get install -y -qq --no-install-recommends \
  python3.11 python3.11-venv python-is-python3 ca-certificates >&2
chroot "$root" apt-get clean
# The image trusts what this machine trusts (a machine whose TLS is inspected reaches PyPI only
# through its own certificate authority, and the build installs from PyPI).
cp /etc/ssl/certs/ca-certificates.crt "$root"/etc/ssl/certs/ca-certificates.crt
# What the official slim image leaves out too: package lists, docs, man pages, translations.
rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/usr/share/locale/* "$root"/var/cache/debconf/*-old "$root"/var/log/*.log

tar -C "$root" --numeric-owner -c . |
  docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag"
docker image ls "$tag"
