"""Stand-ins for the images critest v1.36 pulls, served offline through registry mirrors.

critest pulls by upstream names (registry.k8s.io/..., gcr.io/k8s-staging-cri-tools/...,
k8s.gcr.io/...). `push_standins` builds a busybox-based stand-in for each, with what its
specs need of it (a user, a group file, a web server on a port, a setuid program, distinct
or shared content), and pushes it to the loopback registry under the same repository path;
`write_mirrors` writes hosts.toml files that send each of those hosts to that registry, so
no pull leaves the machine.

The base is the host's busybox-static with hard-linked applets like the upstream busybox
image (critest masks /bin/ls, which must not be a symlink to busybox itself), small shell
versions of the applets critest runs that Debian's busybox-static lacks, and as /bin/sh
Debian's dynamically linked busybox (with its libraries), which hack/setup.sh --dev keeps
at SHELL_BUSYBOX: it runs commands through $PATH as the upstream image's shell does, where
busybox-static would run its own `ls` even with /bin/ls masked.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from tests.e2e import imagebuild as ib

UPSTREAM_HOSTS = ("registry.k8s.io", "gcr.io", "k8s.gcr.io")
STAGING = "k8s-staging-cri-tools/"  # gcr.io/k8s-staging-cri-tools/...

# `pgrep NAME`: the pids whose command name contains NAME.
PGREP = """#!/bin/sh
rc=1
for d in /proc/[0-9]*; do
  read -r comm < "$d/comm" 2>/dev/null || continue
  case "$comm" in *"$1"*) echo "${d#/proc/}"; rc=0 ;; esac
done
exit $rc
"""

# `ipcs -m`: the shared memory segments of this IPC namespace.
IPCS = """#!/bin/sh
echo "------ Shared Memory Segments --------"
echo "key shmid owner perms bytes nattch"
while read -r key shmid perms size cpid lpid nattch uid rest; do
  [ "$key" = key ] || echo "$key $shmid $uid $perms $size $nattch"
done < /proc/sysvipc/shm
"""

TOOLS: ib.LayerSpec = [
    ib.directory("usr"), ib.directory("usr/bin"), ib.directory("var"),
    ib.directory("var/run"),
    ib.file("usr/bin/pgrep", PGREP, 0o755), ib.file("usr/bin/ipcs", IPCS, 0o755),
]

SHELL_BUSYBOX = "/opt/crishim/test/busybox"


@cache
def shell_layer() -> bytes:
    """/bin/sh: the dynamic busybox plus the shared libraries it loads, at the paths ldd
    names (the host's own copies)."""
    if not os.access(SHELL_BUSYBOX, os.X_OK):
        raise RuntimeError(f"{SHELL_BUSYBOX} is missing: run hack/setup.sh --dev")
    out = subprocess.run(["ldd", SHELL_BUSYBOX], check=True, capture_output=True,
                         text=True).stdout
    libs = [w for line in out.splitlines() for w in line.split() if w.startswith("/")]
    entries: list[ib.Entry] = [ib.directory("bin")]
    made = {"bin"}
    for lib in libs:
        parts = lib.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in made:
                made.add(d)
                entries.append(ib.directory(d))
        with open(os.path.realpath(lib), "rb") as fh:
            entries.append(ib.file(lib.strip("/"), fh.read(), 0o755))
    with open(SHELL_BUSYBOX, "rb") as fh:
        entries.append(ib.file("bin/sh", fh.read(), 0o755))
    return ib.make_tar(entries)


# busybox's own image has www-data (33); the base stand-in layer does not.
PASSWD_WWW = ib.PASSWD + "www-data:x:33:33:www-data:/var/www:/bin/false\n"
GROUP_WWW = ib.GROUP + "www-data:x:33:\n"


def _image(*layers: ib.LayerSpec, config: Mapping[str, Any] | None = None) -> ib.BuiltImage:
    return ib.build_image([ib.busybox_layer_tar(hardlinks=True), shell_layer(), TOOLS, *layers],
                          config_overrides=config)


def _etc(passwd: str, group: str) -> list[ib.Entry]:
    return [ib.directory("etc"), ib.file("etc/passwd", passwd), ib.file("etc/group", group)]


def _web_server(port: int, docroot: str, banner: str = "") -> ib.BuiltImage:
    """A web server answering GET / with 200 on `port`: busybox httpd, run as a process
    named nginx with "master process" in its command line (critest looks for both), its
    pid in /var/run/nginx.pid like nginx's."""
    parts = docroot.split("/")
    dirs = [ib.directory("/".join(parts[:i])) for i in range(1, len(parts) + 1)]
    layer = [ib.directory("usr/sbin"), ib.symlink("usr/sbin/nginx", "/bin/busybox"), *dirs,
             ib.file(f"{docroot}/index.html", "<h1>It works (stand-in)</h1>\n")]
    script = (f"{banner}echo $$ > /var/run/nginx.pid && exec -a httpd /usr/sbin/nginx "
              f"-f -p {port} -h /{docroot} -r 'master process'")
    return _image(layer, config={"Cmd": ["sh", "-c", script]})


def _marked(name: str) -> ib.BuiltImage:
    """A busybox with a file of its own: distinct content, so a distinct image ID."""
    return _image([ib.file(name, name + "\n")])


def _user(user: str) -> ib.BuiltImage:
    return _image(_etc(PASSWD_WWW, GROUP_WWW), config={"User": user})


def _predefined_group() -> ib.BuiltImage:
    """User 1000 (default-user), a member of group 50000 in /etc/group."""
    passwd = ib.PASSWD.replace("app:x:1000:1000:app:", "default-user:x:1000:1000:default-user:")
    group = (ib.GROUP.replace("app:x:1000:", "default-user:x:1000:")
             + "group-defined-in-image:x:50000:default-user\n")
    return _image(_etc(passwd, group), config={"User": "1000"})


def _nonewprivs() -> ib.BuiltImage:
    """Prints "Effective uid: N" from a setuid-root program, so N is 0 unless no_new_privs
    stops the escalation. busybox drops setuid rights for every applet except those
    /etc/busybox.conf grants them to (here awk), when it is setuid root itself."""
    with open(ib.BUSYBOX, "rb") as fh:
        binary = fh.read()
    # Its own copy: the base layer's applets are hard links of the plain /bin/busybox.
    layer = [ib.directory("etc"), ib.directory("usr/local"), ib.directory("usr/local/bin"),
             ib.file("usr/local/bin/busybox", binary, 0o4755),
             ib.symlink("usr/local/bin/awk", "busybox"),
             ib.file("etc/busybox.conf", "[SUID]\nawk = ssx root.root\n", 0o600)]
    program = ('BEGIN { while ((getline l < "/proc/self/status") > 0) '
               'if (l ~ /^Uid:/) { split(l, f); print "Effective uid: " f[3] } }')
    return _image(layer, config={"Cmd": ["/usr/local/bin/awk", program]})


def standins() -> dict[str, ib.BuiltImage]:
    """repository:tag (as pushed, without the upstream host) -> image."""
    same_tags = _marked("same-image")
    images = {
        # registry.k8s.io/e2e-test-images/...
        "e2e-test-images/busybox:1.29-2": _image(),
        "e2e-test-images/nginx:1.14-2": _web_server(80, "usr/share/nginx/html"),
        "e2e-test-images/httpd:2.4.39-4": _web_server(
            80, "usr/local/apache2/htdocs", banner="echo 'httpd: stand-in listening on 80'; "),
        "e2e-test-images/nonewprivs:1.3": _nonewprivs(),
        # registry.k8s.io/pause:3.9 and k8s.gcr.io/pause:3.9: one image from two registries
        "pause:3.9": _marked("pause"),
        # gcr.io/k8s-staging-cri-tools/...
        f"{STAGING}hostnet-nginx-{ib.host_arch()}:latest": _web_server(
            12003, "usr/share/nginx/html"),
        f"{STAGING}test-image-user-uid:latest": _user("1002"),
        f"{STAGING}test-image-user-username:latest": _user("www-data"),
        f"{STAGING}test-image-user-uid-group:latest": _user("1003:1004"),
        f"{STAGING}test-image-user-username-group:latest": _user("www-data:1004"),
        f"{STAGING}test-image-predefined-group:latest": _predefined_group(),
        f"{STAGING}test-image-latest:latest": _marked("test-image-latest"),
        f"{STAGING}test-image-tag:test": _marked("test"),
        f"{STAGING}test-image-tag:all": _marked("all"),
        # test-image-digest is pulled by a fixed upstream digest: no stand-in can match it.
    }
    for n in (1, 2, 3):
        images[f"{STAGING}test-image-{n}:latest"] = _marked(f"test-image-{n}")
        images[f"{STAGING}test-image-tags:{n}"] = same_tags
    return images


def push_standins(registry_host: str) -> int:
    """Push every stand-in; returns how many references were pushed."""
    images = standins()
    for ref, image in images.items():
        repo, _, tag = ref.rpartition(":")
        ib.push_image(registry_host, repo, tag, image)
    return len(images)


def write_mirrors(certs_d: str, registry_host: str, hosts: Sequence[str] = UPSTREAM_HOSTS
                  ) -> None:
    """hosts.toml for each upstream host: pull and resolve from the loopback registry."""
    for host in hosts:
        os.makedirs(os.path.join(certs_d, host), exist_ok=True)
        with open(os.path.join(certs_d, host, "hosts.toml"), "w") as fh:
            fh.write(f'server = "https://{host}"\n'
                     f'[host."http://{registry_host}"]\n'
                     f'  capabilities = ["pull", "resolve"]\n')
