#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the project's own inputs (specs/,
golden files, this host's apt lists when present) and small generated valid inputs (frames,
debs, image archives). Deterministic; rerun after changing a format. Regression inputs found
by fuzzing are kept under the same directories with a `regress-` prefix and are not touched."""
import gzip, hashlib, io, json, lzma, os, struct, subprocess, sys, tarfile, tempfile
from pathlib import Path

FUZZ = Path(__file__).resolve().parent.parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / ("seed-" + name)).write_bytes(data)


def files(glob_root, pattern):
    return sorted(p for p in glob_root.glob(pattern) if p.is_file())


# 1, 2: specs and policies
for p in files(ROOT / "specs", "*.vse.yaml") + files(ROOT / "specs/invalid", "*.vse.yaml") + files(ROOT / "vsec/tests/golden", "**/*.vse.yaml"):
    put("spec", p.parent.name + "-" + p.name, p.read_bytes())
for p in files(ROOT / "specs", "*.policy.yaml") + files(ROOT / "specs/invalid", "*.policy.yaml") + files(ROOT / "vsec/tests/golden", "**/*.policy.yaml"):
    put("policy", p.parent.name + "-" + p.name, p.read_bytes())

# 3: lockfiles
for p in files(ROOT / "vsec/tests/golden", "**/*.lock"):
    text = p.read_bytes()
    put("lockfile", p.parent.name + "-" + p.name, text)
    put("lockfile", p.parent.name + "-head-" + p.name, text[:1500])

# 4: Debian indices. First byte: low bits % 3 pick Packages/Release/InRelease, bits 4-5 the
# compression (0 none, 1 gz, 2 xz, 3 lz4).
def sel(kind, comp):
    for b in range(256):
        if b % 3 == kind and (b >> 4) & 3 == comp:
            return bytes([b])

pk = (ROOT / "vsec/tests/golden/synthetic/Packages").read_bytes()
put("debian_index", "packages-synthetic", sel(0, 0) + pk)
put("debian_index", "packages-synthetic.gz", sel(0, 1) + gzip.compress(pk, mtime=0))
put("debian_index", "packages-synthetic.xz", sel(0, 2) + lzma.compress(pk))
release = ("Origin: Debian\nLabel: Debian\nSuite: stable\nCodename: bookworm\n"
           "Date: Tue, 24 Nov 2026 00:34:33 UTC\nValid-Until: Tue, 01 Dec 2026 00:34:33 UTC\n"
           "Acquire-By-Hash: yes\nArchitectures: amd64\nComponents: main\n"
           "Snapshots: https://snapshot.debian.org/archive/debian/@SNAPSHOTID@/\nSHA256:\n"
           " 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages\n"
           " 0e07a6fd8d6d6e8b7e6e1d0f7c5bb0e9d4d6a1c7b3f8f1e2d3c4b5a69788796a 1234 main/binary-amd64/Packages.xz\n")
put("debian_index", "release", sel(1, 0) + release.encode())
lists = Path("/var/lib/apt/lists")
for p in sorted(lists.glob("*InRelease")) if lists.is_dir() else []:
    if p.stat().st_size <= 60000:
        put("debian_index", "inrelease-" + p.name.split("_dists_")[-1], sel(2, 0) + p.read_bytes())
for p in sorted(lists.glob("*Packages.lz4")) if lists.is_dir() else []:
    if p.stat().st_size <= 20000:
        put("debian_index", "packages-lz4-" + p.name.split("_dists_")[-1], sel(0, 3) + p.read_bytes())

# 5: .debs (mode byte 0: the rest is the raw file)
RAW = b"\0"


def ar(members):
    out = b"!<arch>\n"
    for name, data in members:
        out += b"%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name.encode(), 0, 0, 0, b"100644", len(data))
        out += data + (b"\n" if len(data) % 2 else b"")
    return out


def tar(entries):
    """entries: (name, type, data_or_linkname)"""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, ty, x in entries:
            i = tarfile.TarInfo(name)
            i.mtime = 1700000000
            i.mode = 0o755 if ty in (tarfile.DIRTYPE, tarfile.SYMTYPE) else 0o644
            if ty == tarfile.REGTYPE:
                i.size = len(x)
                t.addfile(i, io.BytesIO(x))
            else:
                i.type = ty
                if ty in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    i.linkname = x
                t.addfile(i)
    return buf.getvalue()


control = tar([("./control", tarfile.REGTYPE, b"Package: seed\nVersion: 1.0\nArchitecture: amd64\n"),
               ("./postinst", tarfile.REGTYPE, b"#!/bin/sh\n")])
D, F, S, L = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
datas = {
    "plain": [("./", D, None), ("./usr/", D, None), ("./usr/bin/", D, None), ("./usr/bin/tool", F, b"#!/bin/sh\necho hi\n"),
              ("./bin", S, "usr/bin"), ("./usr/bin/tool2", L, "./usr/bin/tool")],
    "through-symlink": [("./", D, None), ("./etc", S, "/tmp"), ("./etc/x", F, b"x")],
    "dotdot": [("./", D, None), ("../../escape", F, b"x"), ("./a/../../../escape2", F, b"y")],
    "symlink-up": [("./", D, None), ("./up", S, "../../../canary"), ("./up/file", F, b"overwritten")],
    "abs-symlink": [("./", D, None), ("./root", S, "/"), ("./root/etc/passwd", F, b"x")],
    "hardlink-out": [("./", D, None), ("./h", L, "../canary/file")],
    "dir-over-file": [("./", D, None), ("./a", F, b"1"), ("./a/", D, None), ("./a/b", F, b"2")],
}
comps = {"": lambda b: b, ".gz": lambda b: gzip.compress(b, mtime=0), ".xz": lambda b: lzma.compress(b)}
try:
    import zstandard  # optional
    comps[".zst"] = lambda b: zstandard.ZstdCompressor().compress(b)
except ImportError:
    pass
for n, (name, ents) in enumerate(sorted(datas.items())):
    suffix = list(comps)[n % len(comps)]
    deb = ar([("debian-binary", b"2.0\n"), ("control.tar.gz", gzip.compress(control, mtime=0)),
              ("data.tar" + suffix, comps[suffix](tar(ents)))])
    put("deb_extract", name + ".deb", RAW + deb)
put("deb_extract", "no-data.deb", RAW + ar([("debian-binary", b"2.0\n"), ("control.tar", control)]))
put("deb_extract", "bad-version.deb", RAW + ar([("debian-binary", b"3.0\n")]))
# A real one from dpkg-deb when available (zstd data, as current Debian writes).
with tempfile.TemporaryDirectory() as d:
    pkg = Path(d) / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text("Package: seed\nVersion: 1.0\nArchitecture: amd64\nMaintainer: x <x@example.invalid>\nDescription: seed\n")
    (pkg / "usr/share/doc/seed").mkdir(parents=True)
    (pkg / "usr/share/doc/seed/README").write_text("seed\n")
    os.symlink("share/doc", pkg / "usr/doc")
    for comp in ("zstd", "xz", "gzip"):
        out = Path(d) / f"seed-{comp}.deb"
        r = subprocess.run(["dpkg-deb", "-Z" + comp, "--root-owner-group", "-b", str(pkg), str(out)], capture_output=True)
        if r.returncode == 0:
            put("deb_extract", f"dpkg-deb-{comp}.deb", RAW + out.read_bytes())

# 6: image archives (mode byte 0: raw OCI archive, 1: raw docker archive)
def sha(b):
    return hashlib.sha256(b).hexdigest()


layer1 = tar([("etc/", D, None), ("etc/os-release", F, b"ID=debian\n"), ("bin", S, "usr/bin"), ("usr/", D, None), ("usr/bin/", D, None),
              ("usr/bin/sh", F, b"sh"), ("var/lib/dpkg/", D, None),
              ("var/lib/dpkg/status", F, b"Package: base\nStatus: install ok installed\nVersion: 1\nArchitecture: amd64\n\n")])
layer2 = tar([("etc/.wh.os-release", F, b""), ("usr/bin/.wh..wh..opq", F, b""), ("usr/bin/new", F, b"n"),
              ("tmp/", D, None)])
layer_bad = tar([("a", S, "../../.."), ("a/b", F, b"x"), ("../x", F, b"y")])


def oci(layers, gz=False):
    blobs, descs, diffs = {}, [], []
    for l in layers:
        stored = gzip.compress(l, mtime=0) if gz else l
        blobs[sha(stored)] = stored
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else ""), "digest": "sha256:" + sha(stored), "size": len(stored)})
        diffs.append("sha256:" + sha(l))
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": "2024-05-01T00:00:00Z", "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    blobs[sha(config)] = config
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + sha(config), "size": len(config)},
                           "layers": descs}).encode()
    blobs[sha(manifest)] = manifest
    index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + sha(manifest),
                                                             "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "latest"},
                                                             "platform": {"architecture": "amd64", "os": "linux"}}]}).encode()
    ents = [("oci-layout", F, b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", F, index)]
    ents += [("blobs/sha256/" + h, F, b) for h, b in sorted(blobs.items())]
    return tar(ents)


def docker(layers):
    ents, names, diffs = [], [], []
    for l in layers:
        h = sha(l)
        ents.append((h + "/layer.tar", F, l))
        names.append(h + "/layer.tar")
        diffs.append("sha256:" + h)
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    ents.append((sha(config) + ".json", F, config))
    ents.append(("manifest.json", F, json.dumps([{"Config": sha(config) + ".json", "RepoTags": ["seed:latest"], "Layers": names}]).encode()))
    return tar(ents)


put("oci_import", "oci-two-layers.tar", RAW + oci([layer1, layer2]))
put("oci_import", "oci-gzip.tar", RAW + oci([layer1], gz=True))
put("oci_import", "oci-escape.tar", RAW + oci([layer_bad]))
put("oci_import", "docker-two-layers.tar", b"\1" + docker([layer1, layer2]))
put("oci_import", "docker-escape.tar", b"\1" + docker([layer_bad]))

# 7: image manifests
m = {"format": 1, "builder": "imgbuild 0.1.0", "lock_hash": "sha256:" + "0" * 64, "customization_hash": "sha256:" + "1" * 64,
     "epoch": 1700000000, "kernel_version": "6.1.0-13-cloud-amd64", "kernel_cmdline": "console=ttyS0 root=LABEL=vse-root ro",
     "root_format": "ext4", "root_uuid": "5f1b2c3d-0000-4000-8000-000000000001", "root_label": "vse-root",
     "agent_path": "/sbin/vse-agent", "agent_sha256": "2" * 64, "packages": 3,
     "initramfs": {"modules": ["virtio_blk", "ext4"], "builtin": ["virtio_pci"], "unavailable": []},
     "parts": {"kernel": {"file": "vmlinuz", "size": 100, "sha256": "3" * 64}, "initrd": {"file": "initrd.img", "size": 50, "sha256": "4" * 64},
               "root": {"file": "root.ext4", "size": 1048576, "sha256": "5" * 64}}}
put("image_manifest", "built.json", json.dumps(m, indent=2))
m2 = dict(m, parts=dict(m["parts"], root={"file": "../../etc/passwd", "size": 1, "sha256": "6" * 64}))
put("image_manifest", "part-escape.json", json.dumps(m2))
put("image_manifest", "future-format.json", json.dumps(dict(m, format=99)))

# 8: agent frames. First byte: bit 0 authenticated, bit 1 direction, bit 2 StageMsg (else Msg).
def body(seq, msg, blob=b""):
    j = json.dumps(msg).encode()
    return struct.pack(">QI", seq, len(j)) + j + blob

msgs = [{"Hello": {"id": 1, "listen": "127.0.0.1:5000"}}, {"Welcome": {"id": 0}}, {"Ping": {"seq": 3}}, "Bye"]
for i, msg in enumerate(msgs):
    put("agent_frame", f"msg-{i}", bytes([1]) + body(i, msg))
stage = [{"Have": {"next": 1, "complete": False}}, {"Chunk": {"digest": "a" * 64, "index": 0, "encoding": "zstd"}},
         {"Offer": {"digest": "b" * 64, "files": [["root.ext4", 8192]], "chunk_size": 4096, "table": [None, "c" * 64], "k": 2,
                    "nodes": [[1, "127.0.0.1:9"], [4294967295, "127.0.0.1:9"]]}},
         {"Report": {"nodes": [[1, {"outcome": "staged"}], [2, {"outcome": "failed", "reason": "x"}]]}}]
for i, msg in enumerate(stage):
    put("agent_frame", f"stage-{i}", bytes([5]) + body(i, msg, b"blob" if i == 1 else b""))
put("agent_frame", "unauth", bytes([0]) + body(0, msgs[0]) + b"\0" * 32)
put("agent_frame", "json-len-past-end", bytes([1]) + struct.pack(">QI", 0, 1000) + b"{}")

# 9: QMP conversations (what QEMU writes: greeting, replies, events in between)
greet = '{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""}, "capabilities": ["oob"]}}\n'
put("qmp_reply", "running", greet + '{"return": {}}\n' + '{"return": {"status": "running", "singlestep": false, "running": true}}\n' * 4)
put("qmp_reply", "events", greet + '{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}\n{"return": {}}\n'
    '{"event": "STOP"}\n{"return": {"status": "paused", "running": false}}\n{"return": {"status": "inmigrate"}}\n')
put("qmp_reply", "error", greet + '{"return": {}}\n{"error": {"class": "GenericError", "desc": "no"}}\n')
put("qmp_reply", "garbage", greet + '{"return": {}}\n[1,2\n')
put("qmp_reply", "no-greeting", '{"return": {}}\n')

# 10: staging has no hand-written seeds (structured input): the fuzzer starts from scratch;
# regression inputs live in corpus/stage_receiver.

# 11: HTTP requests
tok = "fuzz-token-0123456789"
reqs = {
    "page": "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n" % tok,
    "status": "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer %s\r\n\r\n" % tok,
    "metrics": "GET /metrics HTTP/1.1\r\nHost: [::1]:80\r\nCookie: a=b; vse_status=%s\r\n\r\n" % hashlib.sha256(tok.encode()).hexdigest(),
    "login": "POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\ntoken=%s" % (6 + len(tok), tok),
    "login-pct": "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 15\r\n\r\ntoken=%41%zz+x&",
    "no-token": "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "bad-host": "GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    "chunked": "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ntoken\r\n0\r\n\r\n",
    "http10": "GET /metrics HTTP/1.0\r\n\r\n",
}
for k, v in reqs.items():
    put("status_http", k, v)

# 12: guest-agent protocol lines (both directions)
lines = [
    {"op": "exec", "id": 1, "argv": ["/bin/true"], "env": {"A": "b"}, "cwd": "/", "stdin": "x"},
    {"op": "exec-stream", "id": 2, "argv": ["sh", "-c", "echo hi"]},
    {"type": "ready", "version": 1, "kernel": "6.1.0"},
    {"type": "exited", "id": 1, "status": 0, "stdout": "out", "stderr": ""},
    {"type": "output", "id": 2, "stream": "stdout", "data": "hi\n"},
    {"type": "sample", "id": 3, "meminfo": "MemTotal: 1 kB", "stat": "cpu 1 2 3"},
    {"type": "ok", "id": 4}, {"type": "error", "id": 5, "message": "no"},
    {"type": "barrier", "conn": 1, "line": "HELLO 0 1"}, {"type": "barrier-closed", "conn": 1},
    {"op": "barrier", "conn": 1, "line": "READY"}, {"op": "barrier-close", "conn": 1},
]
put("guest_protocol", "all", "\n".join(json.dumps(l) for l in lines) + "\n")
for i, l in enumerate(lines):
    put("guest_protocol", f"line-{i}", json.dumps(l))
print("corpus written under", CORPUS)
