"""Harder chaos, on a private stack under a PostgreSQL write load, with `lakestream maintain --watch`
running beside the pipeline all along (compaction, delete and manifest rewrites, snapshot expiry):

1. SIGKILLs of `lakestream run` (driver + Spark JVM): some parked at a pause point inside the commit
   protocol (lakestream/faults.py), the rest at random moments;
2. the broker frozen, then stopped, for a while each: capture and the pipeline wait and resume by themselves;
3. a SIGKILL of `lakestream capture`: Debezium re-sends from its last offset flush;
4. a restart of the PostgreSQL cluster holding the JDBC catalog (and the source database).

Each scenario ends with the running pipeline caught up and `lakestream verify` passing (no missing,
extra, differing or duplicated key), the append table holding every event sent exactly once and each
transform output one row per change record (counts, not latest-per-key: a double apply shows), and
asserts that its fault was observed (the process gone, a failed batch, a re-sent event). The report
carries the run's random seed. The short scale runs in `make test`; `make chaos` runs the long
one (marker `chaos`), sized by LAKESTREAM_CHAOS_KILLS, LAKESTREAM_CHAOS_COMMIT_KILLS,
LAKESTREAM_CHAOS_BROKER_OUTAGE_S, LAKESTREAM_CHAOS_CATALOG_OUTAGE_S, LAKESTREAM_CHAOS_RATE and
LAKESTREAM_CHAOS_LOAD_S, and writes its figures to LAKESTREAM_CHAOS_REPORT when set.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from chaos_harness import ChaosEnv, count_resent, end_offsets

from lakestream.faults import PAUSE_MARKER, POINTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scale:
    kills: int
    commit_kills: int  # of ``kills``, parked at a pause point inside the commit
    broker_outage_s: float
    catalog_outage_s: float
    rate: int  # changes/s of the write load
    load_s: float  # load before and after each fault


def _env(name: str, default: float) -> float:
    return float(os.environ.get(f"LAKESTREAM_CHAOS_{name}", default))


# Two kills: one random, one parked at a pause point drawn at random (the long run rotates through all three).
SHORT = Scale(kills=2, commit_kills=1, broker_outage_s=6, catalog_outage_s=3, rate=30, load_s=2)


def long_scale() -> Scale:
    kills = int(_env("KILLS", 20))
    return Scale(
        kills=kills,
        commit_kills=int(_env("COMMIT_KILLS", kills // 2)),
        broker_outage_s=_env("BROKER_OUTAGE_S", 30),
        catalog_outage_s=_env("CATALOG_OUTAGE_S", 15),
        rate=int(_env("RATE", 150)),
        load_s=_env("LOAD_S", 10),
    )


@pytest.fixture(scope="module", params=["short", pytest.param("long", marks=pytest.mark.chaos)])
def chaos(request, stack_factory, service_dir_factory):
    scale = SHORT if request.param == "short" else long_scale()
    workdir = service_dir_factory("chaos")
    env = ChaosEnv(stack_factory(), workdir, scale.rate, seed=int(time.time()))
    env.scale = scale
    started = time.monotonic()
    failed_before = request.session.testsfailed
    try:
        env.start()
        yield env
    finally:
        env.close()
        env.stack.down()  # its broker and PostgreSQL would otherwise idle beside the rest of the session
        if request.session.testsfailed > failed_before:
            _keep_logs(workdir, f"chaos-{request.param}-{env.figures.seed}")
        figures = asdict(env.figures) | {
            "scale": request.param,
            "parameters": asdict(scale),
            "seconds": round(time.monotonic() - started, 1),
            "load_average": os.getloadavg(),
        }
        log.info("chaos figures: %s", json.dumps(figures))
        if os.environ.get("LAKESTREAM_CHAOS_REPORT"):
            Path(os.environ["LAKESTREAM_CHAOS_REPORT"]).write_text(json.dumps(figures, indent=2) + "\n")


def _keep_logs(workdir: Path, name: str) -> None:
    """A failed scenario's logs (pipeline, capture, maintenance) outlive the run's state directories, which are
    removed at its end: ``.lakestream/artifacts/<name>/``."""
    import shutil

    kept = Path(__file__).resolve().parents[2] / ".lakestream" / "artifacts" / name
    kept.mkdir(parents=True, exist_ok=True)
    for path in workdir.glob("*.log"):
        shutil.copy2(path, kept / path.name)
    log.warning("chaos: a scenario failed; its logs are kept in %s", kept)


def _timed(env: ChaosEnv, name: str, started: float) -> None:
    env.figures.scenarios[name] = round(time.monotonic() - started, 1)


@pytest.mark.timeout(3600)
def test_sigkills_of_the_pipeline(chaos: ChaosEnv):
    """Kills parked inside the commit (in turn at each pause point) alternate with random ones."""
    started = time.monotonic()
    scale, pipeline = chaos.scale, chaos.pipeline
    load = chaos.load()
    try:
        commit_kills = 0
        first_point = chaos.rng.randrange(len(POINTS))  # where the rotation through the pause points starts
        for i in range(scale.kills):
            # The first kill takes the running process as it is; then the commit kills are spread over
            # the run (kill i is one when their share so far is behind).
            in_commit = (
                i > 0 and commit_kills < scale.commit_kills and commit_kills * scale.kills <= i * scale.commit_kills
            )
            if in_commit:
                point = POINTS[(first_point + commit_kills) % len(POINTS)]
                pipeline.start(pause_at=f"{point}:300")
                paused = f"{PAUSE_MARKER} {point}"
                pipeline.wait_for(lambda paused=paused: paused in pipeline.log_text(), f"pause at {point}", 300)
                pipeline.kill_group()
                commit_kills += 1
                chaos.figures.kills_in_commit[point] = chaos.figures.kills_in_commit.get(point, 0) + 1
            else:
                if not pipeline.alive:
                    pipeline.start()
                # Anywhere from the start-up to a few batches in (maintenance rounds included).
                if chaos.rng.random() < 0.8:
                    pipeline.wait_for(lambda: pipeline.batches(), "first batch", 300)
                time.sleep(chaos.rng.uniform(0, 6))
                assert pipeline.alive, pipeline.tail()
                pipeline.kill_group()
                chaos.figures.random_kills += 1
            assert not pipeline.alive, "the SIGKILL did not end the pipeline"  # the fault really happened
            chaos.figures.kills += 1
            log.info("SIGKILL %d/%d (%s)", i + 1, scale.kills, "in commit" if in_commit else "random")
        pipeline.start()
        pipeline.wait_for(lambda: pipeline.batches(), "first batch after the kills", 300)
        time.sleep(scale.load_s)
    finally:
        chaos.stop_load(load)
    chaos.settle_and_verify()
    assert chaos.figures.kills == scale.kills and sum(chaos.figures.kills_in_commit.values()) == scale.commit_kills
    _timed(chaos, "sigkills", started)


@pytest.mark.timeout(1800)
def test_broker_outage(chaos: ChaosEnv):
    """Apache Kafka is away three times under load, each time for ``broker_outage_s``: first frozen (SIGSTOP,
    then SIGCONT: connections stay open and requests hang, as with a hung broker or a network partition),
    then stopped (SIGTERM: a controlled shutdown) and restarted, then SIGKILLed and restarted on the same
    data directory (its logs recovered at start, as after a crash). Capture's producer waits: a batch it
    cannot deliver is not acknowledged to Debezium, whose offsets stay put, and it carries on once the
    broker is back, with nothing restarted. The same pipeline process fails its batches meanwhile and
    resumes. No topic loses a record, capture publishes no change twice (its idempotent producer's
    sequence state survives both restarts), and `verify` passes."""
    started = time.monotonic()
    pipeline, capture, scale = chaos.pipeline, chaos.capture, chaos.scale
    servers = chaos.info.bootstrap_servers
    load = chaos.load()
    try:
        time.sleep(scale.load_s)  # also makes sure both topics exist (they are created by the first record)
        starts = end_offsets(servers, chaos.topics)
        failed_before = chaos.broker_errors()
        for outage in ("frozen", "stopped", "killed"):
            before = len(pipeline.batches())
            ends = end_offsets(servers, chaos.topics)
            if outage == "frozen":
                chaos.figures.broker_outage_s += round(chaos.freeze_broker(scale.broker_outage_s), 1)
            else:
                chaos.stack.broker.stop() if outage == "stopped" else chaos.stack.broker.kill()
                stopped = time.monotonic()
                time.sleep(scale.broker_outage_s)
                chaos.stack.broker.start()
                chaos.figures.broker_outage_s += round(time.monotonic() - stopped, 1)
            assert pipeline.alive, f"the pipeline gave up while the broker was {outage}:\n{pipeline.tail()}"
            assert capture.running, f"capture died while the broker was {outage}:\n{capture.log_text()[-4000:]}"
            back = end_offsets(servers, chaos.topics)
            assert all(back[t] >= ends[t] for t in chaos.topics), (
                f"topics went back after the broker was {outage}: {ends} → {back}"
            )
            resumed = time.monotonic()
            pipeline.wait_for(
                lambda before=before: len(pipeline.batches()) > before, f"batch after the broker was {outage}", 300
            )
            log.info(
                "broker %s: the pipeline's next batch came %.1fs after it was back", outage, time.monotonic() - resumed
            )
            time.sleep(scale.load_s)
    finally:
        chaos.stop_load(load)
    settling = time.monotonic()
    chaos.settle_and_verify()
    log.info("broker outage: caught up and verified in %.1fs", time.monotonic() - settling)
    failed = chaos.broker_errors() - failed_before
    chaos.figures.faults_observed["broker_outage"] = failed
    assert failed > 0, "the pipeline met no broker failure while it was away: the outage was not observed"
    resent = count_resent(servers, chaos.topics, starts)
    chaos.figures.broker_resent += resent
    assert resent == 0, f"capture published {resent} change events twice across the broker outage"
    _timed(chaos, "broker_outage", started)


@pytest.mark.timeout(1800)
def test_sigkill_of_capture(chaos: ChaosEnv):
    """Debezium re-sends what it published after its last offset flush; the mirror stays exact."""
    started = time.monotonic()
    scale = chaos.scale
    starts = end_offsets(chaos.info.bootstrap_servers, chaos.topics)
    load = chaos.load()
    resent = 0
    try:
        # Debezium flushes its offsets every second: a kill just after a flush, with no event published since
        # (a starved load generator on a busy machine), leaves nothing to re-send. Kill again until a re-send
        # shows that the fault was met (at most three kills).
        for _ in range(3):
            time.sleep(scale.load_s)
            chaos.capture.kill()
            chaos.figures.capture_kills += 1
            chaos.capture.start()
            chaos.capture.wait_until_streaming(300)
            time.sleep(scale.load_s)
            resent = count_resent(chaos.info.bootstrap_servers, chaos.topics, starts)
            if resent > 0:
                break
    finally:
        chaos.stop_load(load)
    chaos.settle_and_verify()
    chaos.figures.capture_resent += resent
    assert resent > 0, "capture re-sent nothing after three SIGKILLs: the fault was not observed"
    _timed(chaos, "capture_sigkill", started)


@pytest.mark.timeout(1800)
def test_catalog_postgres_restart(chaos: ChaosEnv):
    """The PostgreSQL cluster of the JDBC catalog (and of the source) restarts under load: the
    pipeline's batches fail meanwhile and it recovers by itself."""
    started = time.monotonic()
    pipeline, scale = chaos.pipeline, chaos.scale
    load = chaos.load()
    try:
        time.sleep(scale.load_s)
        before = len(pipeline.batches())
        failed_before = chaos.failed_batches()
        chaos.stack.postgres.stop()
        stopped = time.monotonic()
        time.sleep(scale.catalog_outage_s)
        chaos.stack.postgres.start()
        chaos.figures.catalog_outage_s += round(time.monotonic() - stopped, 1)
        assert pipeline.alive, f"the pipeline gave up during the catalog outage:\n{pipeline.tail()}"
        pipeline.wait_for(lambda: len(pipeline.batches()) > before, "batch after the restart", 300)
        failed = chaos.failed_batches() - failed_before
        chaos.figures.faults_observed["catalog_restart"] = failed
        assert failed > 0, "no batch failed while the catalog was down: the outage was not observed"
        if not chaos.capture.running:
            # Debezium's connector stops when its database goes away; its supervisor restarts it.
            chaos.figures.catalog_capture_restarts += 1
            chaos.capture.start()
            chaos.capture.wait_until_streaming(300)
        time.sleep(scale.load_s)
    finally:
        chaos.stop_load(load)
    chaos.settle_and_verify()
    _timed(chaos, "catalog_restart", started)
