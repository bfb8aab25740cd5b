"""Redis in its production shapes, as real processes on free loopback ports: a Cluster of
three masters (optionally with a replica each, for failover) and a Sentinel set (a master, a
replica and three Sentinels). Each can lose a node to SIGKILL and report when the survivors
have promoted a new master."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from gateway.redis_client.plan import RedisPlan, plan_of
from gateway.settings import RedisSettings
from tests.support.procs import Proc, free_port


def plan_for(url: str) -> RedisPlan:
    return plan_of(RedisSettings(url=url))


def sentinel_binary() -> list[str] | None:
    """`redis-sentinel` (Debian's package), else `redis-server --sentinel`."""
    if shutil.which("redis-sentinel"):
        return ["redis-sentinel"]
    server = shutil.which("redis-server")
    return [server, "--sentinel"] if server else None


def _node(port: int, workdir: Path, *extra: str, name: str) -> Proc:
    return Proc(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(workdir), *extra], port, name=name)


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout}s (last error: {last})")


class RedisCluster:
    """`masters` masters, each with `replicas_per_master` replicas; node timeout short, so a
    lost master's replica is promoted within ~2 s."""

    def __init__(self, masters: int = 3, replicas_per_master: int = 0, node_timeout_ms: int = 1000) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
        self.replicas_per_master = replicas_per_master
        self.nodes: list[Proc] = []
        for i in range(masters * (1 + replicas_per_master)):
            port = free_port()
            d = self.workdir / str(port)
            d.mkdir()
            # The cluster bus port on a free port of its own (by default it is port + 10000).
            self.nodes.append(_node(port, d, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                    "--cluster-port", str(free_port()),
                                    "--cluster-node-timeout", str(node_timeout_ms),
                                    # A replica that lost its master a moment ago may still take over.
                                    "--cluster-replica-validity-factor", "0", name=f"redis-cluster-{i}"))

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        hosts = [f"127.0.0.1:{n.port}" for n in self.nodes]
        created = subprocess.run(["redis-cli", "--cluster", "create", *hosts, "--cluster-replicas",
                                  str(self.replicas_per_master), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-2000:]} {created.stderr[-2000:]}")
        _wait(self.healthy, 30, "the cluster did not reach cluster_state:ok")
        return self

    def _info(self, port: int) -> str:
        with redis.Redis(port=port, socket_timeout=1) as client:
            return client.execute_command("CLUSTER", "INFO").decode()

    def live(self) -> list[Proc]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def healthy(self) -> bool:
        return all("cluster_state:ok" in self._info(n.port) for n in self.live())

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def master_of(self, key: str) -> Proc:
        with redis.RedisCluster(host="127.0.0.1", port=self.live()[0].port) as client:
            node = client.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == node.port)

    def wait_healthy(self, timeout: float = 20) -> None:
        _wait(self.healthy, timeout, "the cluster did not recover (cluster_state:ok on every live node)")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


class RedisSentinelSet:
    """A master, a replica and three Sentinels watching them as `service`; down after 1 s."""

    def __init__(self, service: str = "gw") -> None:
        self.service = service
        self.workdir = Path(tempfile.mkdtemp(prefix="redis-sentinel-"))
        self.master = _node(free_port(), self.workdir, name="redis-sentinel-master")
        self.replica = _node(free_port(), self.workdir, "--replicaof", "127.0.0.1", str(self.master.port),
                             name="redis-sentinel-replica")
        binary = sentinel_binary()
        if binary is None:
            raise RuntimeError("neither redis-sentinel nor redis-server is installed")
        self.sentinels: list[Proc] = []
        for i in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {service} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {service} 1000\n"
                f"sentinel failover-timeout {service} 5000\n"
                f"sentinel parallel-syncs {service} 1\n")
            self.sentinels.append(Proc([*binary, str(conf)], port, name=f"redis-sentinel-{i}"))

    def start(self) -> RedisSentinelSet:
        self.master.start()
        self.replica.start()
        with redis.Redis(port=self.replica.port) as client:
            _wait(lambda: client.info("replication").get("master_link_status") == "up", 20,
                  "the replica did not sync with the master")
        for s in self.sentinels:
            s.start()
        # Every Sentinel has found the replica and the other Sentinels.
        def ready() -> bool:
            for s in self.sentinels:
                with redis.Redis(port=s.port, socket_timeout=1) as client:
                    state = client.sentinel_master(self.service)
                    if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < 2:
                        return False
            return True
        _wait(ready, 30, "the Sentinels did not discover each other and the replica")
        return self

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def master_port(self) -> int:
        with redis.Redis(port=self.sentinels[0].port, socket_timeout=1) as client:
            return int(client.sentinel_get_master_addr_by_name(self.service)[1])

    def current_master(self) -> Proc:
        port = self.master_port()
        return self.master if self.master.port == port else self.replica

    def wait_promoted(self, away_from: int, timeout: float = 20) -> int:
        """The new master's port once every Sentinel names one other than `away_from` and it
        answers as a master."""
        def promoted() -> bool:
            for s in self.sentinels:
                with redis.Redis(port=s.port, socket_timeout=1) as client:
                    if int(client.sentinel_get_master_addr_by_name(self.service)[1]) == away_from:
                        return False
            with redis.Redis(port=self.master_port(), socket_timeout=1) as client:
                return client.info("replication")["role"] == "master"
        _wait(promoted, timeout, "the Sentinels did not promote the replica")
        return self.master_port()

    def stop(self) -> None:
        for proc in (*self.sentinels, self.replica, self.master):
            proc.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
