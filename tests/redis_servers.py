"""Redis servers of the tests' own, on free loopback ports, never the shared one on 6379:
a single server, a Redis Cluster (masters with a replica each), and a master with a replica
watched by Sentinels; with TLS when given certificates. Each lives in a temporary directory,
removed with its processes when the context ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.sentinel import Sentinel

from proxy.config.store_url import parse_store_url

START_TIMEOUT = 10.0
MASTER_NAME = "cptest"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(
    port: int, *, tls: Certificates | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server on `port` (TLS only, with `tls`), stopped (SIGTERM) when the context
    ends."""
    with tempfile.TemporaryDirectory(prefix="cptest-redis-") as tmp:
        node = _spawn(Path(tmp), port, [], tls)
        try:
            yield node.process
        finally:
            node.process.terminate()
            node.process.wait(5)


def wait_for(predicate: Callable[[], bool], timeout: float = START_TIMEOUT) -> float:
    """Poll until `predicate()` holds; the seconds it took."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - started


def inspector(url: str) -> redis.Redis | RedisCluster:
    """A synchronous client on the store a URL names, to look at what the proxy wrote."""
    parsed = parse_store_url(url)
    options: dict[str, object] = {"username": parsed.username, "password": parsed.password}
    options |= parsed.tls.options() if parsed.tls else {}
    if parsed.kind == "cluster":
        seeds = [ClusterNode(host, port) for host, port in parsed.nodes]
        return RedisCluster(startup_nodes=seeds, require_full_coverage=False, **options)  # type: ignore[arg-type]
    if parsed.kind == "sentinel":
        sentinels = Sentinel(
            parsed.nodes, sentinel_kwargs=parsed.tls.options() if parsed.tls else {}
        )
        return sentinels.master_for(parsed.master, db=parsed.db, **options)
    return redis.Redis.from_url(url)  # it fails at once when the server is down


def replicated(primary: Node, replica: Node) -> None:
    """Wait until `replica` has every write `primary` has."""

    def offset(node: Node, field: str) -> int:
        return int(node.info("replication")[field])  # type: ignore[call-overload]

    target = offset(primary, "master_repl_offset")
    wait_for(lambda: offset(replica, "slave_repl_offset") >= target)


def cut_replication(primary: Node, replica: Node) -> None:
    """From now on `replica` gets none of `primary`'s writes, until `primary` is gone: it is
    frozen (so it cannot reconnect), and `primary` drops the link."""
    replica.freeze()
    with primary.client() as client:
        client.client_kill_filter(_type="replica")


@dataclasses.dataclass(frozen=True)
class Certificates:
    """A CA and a server certificate it signed, for localhost and 127.0.0.1."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            *("--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key)),
            *("--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no"),
            *("--tls-replication", "yes", "--tls-cluster", "yes"),
        ]

    def client_options(self) -> dict[str, object]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def make_certificates(directory: Path) -> Certificates:
    """Certificates made with the openssl command line (EC keys: quick to make)."""
    ca, cert, key = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", str(ca), "-days", "2",
            "-subj", "/CN=cptest-ca")  # fmt: skip
    openssl("req", *curve, "-keyout", str(key), "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", "ca.key",
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return Certificates(ca, cert, key)


@dataclasses.dataclass
class Node:
    """One redis-server (or Sentinel) process."""

    port: int
    process: subprocess.Popen[bytes]
    tls: Certificates | None = None

    def client(self) -> redis.Redis:
        options = self.tls.client_options() if self.tls else {}
        return redis.Redis(port=self.port, socket_timeout=2, **options)  # type: ignore[arg-type]

    def info(self, section: str) -> dict[str, object]:
        with self.client() as client:
            return client.info(section)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)

    def freeze(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _spawn(
    directory: Path, port: int, args: Sequence[str], tls: Certificates | None = None
) -> Node:
    """redis-server on `port` in its own directory under `directory`, once it accepts."""
    home = directory / str(port)
    home.mkdir()
    ports = ["--port", str(port)]
    if tls:
        ports = ["--port", "0", "--tls-port", str(port), *tls.server_args()]
    settings = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    # Replicas sync at once (the default waits 5 s for more replicas to share one transfer).
    settings += ["--repl-diskless-sync-delay", "0", "--dir", str(home)]
    process = subprocess.Popen(
        ["redis-server", *args, *ports, *settings, "--logfile", str(home / "log")],
        stdout=subprocess.DEVNULL,
    )
    node = Node(port, process, tls)

    def accepts() -> bool:
        assert process.poll() is None, (home / "log").read_text()[-2000:]
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return True
        return False

    wait_for(accepts)
    return node


@contextlib.contextmanager
def _nodes(prefix: str) -> Iterator[tuple[Path, list[Node]]]:
    """A temporary directory and the nodes started in it, all killed when the context ends."""
    nodes: list[Node] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            yield Path(tmp), nodes
        finally:
            for node in nodes:
                if node.alive:
                    node.thaw()
                    node.kill()


def _redis_cli(tls: Certificates | None, *args: str) -> None:
    options = ["--tls", "--cacert", str(tls.ca)] if tls else []
    subprocess.run(["redis-cli", *options, *args], check=True, capture_output=True, timeout=30)


def _url(topology: str, nodes: list[Node], path: str, tls: Certificates | None) -> str:
    """The store URL of these servers (over TLS with `tls`, trusting its CA)."""
    hosts = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    query = f"?ssl_ca_certs={tls.ca}" if tls else ""
    return f"{'rediss' if tls else 'redis'}+{topology}://{hosts}{path}{query}"


@dataclasses.dataclass
class Cluster:
    nodes: list[Node]
    tls: Certificates | None = None

    @property
    def url(self) -> str:
        return _url("cluster", self.nodes, "", self.tls)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def shard(self, key: str) -> tuple[Node, Node]:
        """The master serving `key` and its replica, as a live node sees them."""
        slot = key_slot(key.encode())
        live = next(n for n in self.nodes if n.alive)
        for master, replicas, slots in _shards(live):
            if any(start <= slot <= end for start, end in slots):
                return self.node(master), self.node(replicas[0])
        raise AssertionError(f"slot {slot} is not served")

    def healthy(self) -> bool:
        """Every live node says the cluster is ok, with every slot on a live master."""
        for node in self.nodes:
            if not node.alive:
                continue
            if node.info("cluster")["cluster_enabled"] != 1:
                return False
            with node.client() as client:
                if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                    return False
            shards = _shards(node)
            if not all(self.node(master).alive for master, _, _ in shards):
                return False
            if sum(end - start + 1 for _, _, slots in shards for start, end in slots) < 16384:
                return False
        return True


def _shards(node: Node) -> list[tuple[int, list[int], list[tuple[int, int]]]]:
    """(master port, replica ports, slot ranges) of each master `node` sees as not failed."""
    with node.client() as client:
        nodes = client.execute_command("CLUSTER NODES")  # redis-py parses it: address -> fields
    port = {fields["node_id"]: int(address.rsplit(":", 1)[1]) for address, fields in nodes.items()}
    shards = []
    for fields in nodes.values():
        flags = fields["flags"].split(",")
        if "master" in flags and "fail" not in flags and fields["slots"]:
            ids = fields["node_id"]
            replicas = [port[f["node_id"]] for f in nodes.values() if f["master_id"] == ids]
            slots = [(int(r[0]), int(r[-1])) for r in fields["slots"]]
            shards.append((port[ids], replicas, slots))
    return shards


@contextlib.contextmanager
def redis_cluster(
    masters: int = 3, *, node_timeout_ms: int = 1000, tls: Certificates | None = None
) -> Iterator[Cluster]:
    """`masters` masters with one replica each (`redis-cli --cluster create`), ready when every
    node agrees that every slot is served and every replica is in sync."""
    with _nodes("cptest-cluster-") as (tmp, nodes):
        for _ in range(masters * 2):
            args = ["--cluster-enabled", "yes", "--cluster-port", str(free_port())]
            args += ["--cluster-node-timeout", str(node_timeout_ms)]
            nodes.append(_spawn(tmp, free_port(), args, tls))
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        _redis_cli(tls, "--cluster", "create", *addresses, "--cluster-replicas", "1",
                   "--cluster-yes")  # fmt: skip
        cluster = Cluster(nodes, tls)
        wait_for(cluster.healthy)
        wait_for(lambda: all(_in_sync(n) for n in nodes))
        yield cluster


def _in_sync(node: Node) -> bool:
    replication = node.info("replication")
    return replication["role"] == "master" or replication.get("master_link_status") == "up"


@dataclasses.dataclass
class Sentinels:
    master: Node
    replica: Node
    sentinels: list[Node]
    tls: Certificates | None = None

    @property
    def url(self) -> str:
        return _url("sentinel", self.sentinels, f"/{MASTER_NAME}", self.tls)

    def shard(self, key: str) -> tuple[Node, Node]:
        return self.master, self.replica

    def healthy(self) -> bool:
        """Every live Sentinel names the same master, a live one that says it is master."""
        named = set()
        for sentinel in self.sentinels:
            if sentinel.alive:
                with sentinel.client() as client:
                    named.add(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])
        master = next((n for n in (self.master, self.replica) if n.port in named), None)
        if len(named) != 1 or master is None or not master.alive:
            return False
        return master.info("replication")["role"] == "master"


@contextlib.contextmanager
def redis_sentinels(
    count: int = 3, *, down_after_ms: int = 500, tls: Certificates | None = None
) -> Iterator[Sentinels]:
    """A master, its replica and `count` Sentinels (quorum: a majority), ready when every
    Sentinel knows the replica and the other Sentinels."""
    with _nodes("cptest-sentinel-") as (tmp, nodes):
        master = _spawn(tmp, free_port(), [], tls)
        nodes.append(master)
        replica = _spawn(tmp, free_port(), ["--replicaof", "127.0.0.1", str(master.port)], tls)
        nodes.append(replica)
        sentinels = []
        for _ in range(count):
            port = free_port()
            conf = tmp / f"sentinel-{port}.conf"
            conf.write_text(
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} {count // 2 + 1}\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 5000\n"
            )
            sentinel = _spawn(tmp, port, [str(conf), "--sentinel"], tls)
            nodes.append(sentinel)
            sentinels.append(sentinel)
        setup = Sentinels(master, replica, sentinels, tls)

        def known() -> bool:
            for sentinel in sentinels:
                with sentinel.client() as client:
                    state = client.sentinel_master(MASTER_NAME)
                if state["num-slaves"] < 1 or state["num-other-sentinels"] < count - 1:
                    return False
            return _in_sync(replica)

        wait_for(known)
        yield setup
