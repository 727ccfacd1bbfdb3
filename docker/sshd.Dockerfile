# syntax=docker/dockerfile:1
# A lab SSH host for docker/compose.yaml's `lab` profile: sshd plus what the twin runs (alignflow with
# MindSpore and PyTorch). Three containers of this image play ascend, cpu and cuda, each reached only over SSH,
# like tests/lab/sshd.py does with loopback sshd processes.
#
#   docker/lab/make-keys.sh                          # host keys, the client key, known_hosts (once)
#   docker compose -f docker/compose.yaml --profile lab up -d --build
#
# The host key comes from docker/lab/keys/<host>/ (mounted read-only at /etc/alignflow-lab/), so the controller's
# known_hosts can pin it; the `lab` user accepts only the client key in /etc/alignflow-lab/authorized_keys.
ARG BASE_IMAGE=alignflow:twin
FROM ${BASE_IMAGE}

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --shell /bin/bash lab \
 && install -d -o lab -g lab -m 700 /home/lab/work \
 && install -d -m 755 /run/sshd \
 && rm -f /etc/ssh/ssh_host_*

COPY docker/lab/sshd_config /etc/ssh/sshd_config.d/alignflow-lab.conf
EXPOSE 22
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["/usr/sbin/sshd", "-D", "-e"]
