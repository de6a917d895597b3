"""Which replicas keep their data through a major upgrade, and when a seed is trusted (pure functions)."""

from __future__ import annotations

from types import SimpleNamespace

from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration import major_upgrade_replicas as mur

PRIMARY = "checkpoint: 0/3000060\nstate: shut down\n"


def test_the_checkpoint_is_read_only_when_it_is_an_lsn() -> None:
    assert mur.checkpoint_of(PRIMARY) == "0/3000060"
    assert mur.checkpoint_of("checkpoint: seeded") == mur.SEEDED
    assert mur.checkpoint_of("checkpoint: ; rm -rf /") is None
    assert mur.checkpoint_of("state: no data of PostgreSQL 16") is None


def test_only_replicas_at_the_primarys_checkpoint_are_seeded() -> None:
    plan = mur.plan("0/3000060", {
        "db-1": "checkpoint: 0/3000060\nstate: shut down in recovery",
        "db-2": "checkpoint: 0/2000028\nstate: shut down in recovery",
        "db-3": None,
        "db-4": "checkpoint: seeded",
        "db-5": "state: no data of PostgreSQL 16",
    })  # fmt: skip
    assert plan.seed == ("db-1", "db-4")
    assert plan.reclone == {
        "db-2": "its checkpoint 0/2000028 is not the primary's 0/3000060",
        "db-3": "its stop could not be run",
        "db-5": "its checkpoint could not be read",
    }


def test_without_the_primarys_checkpoint_every_replica_is_recloned() -> None:
    plan = mur.plan(None, {"db-1": "checkpoint: 0/3000060", "db-2": "checkpoint: seeded"})
    assert plan.seed == ("db-2",)  # already holds the new major
    assert plan.reclone == {"db-1": "the primary's shutdown checkpoint is unknown"}


SOURCE = "seed source: entries=1200 links=40 bytes=52000000\n"


def sink(status: int = 0, stdout: str = "seeded: entries=1238 linked=38 unlogged_skipped=2", stderr: str = ""
         ) -> SimpleNamespace:  # fmt: skip
    return SimpleNamespace(exit_status=status, stdout=stdout, stderr=stderr)


def test_a_seed_is_trusted_only_when_every_entry_and_link_is_accounted_for() -> None:
    assert mur.seed_failure(0, SOURCE, sink()) is None
    assert mur.seed_failure(0, SOURCE, sink(stdout="seeded: already")) is None
    short = mur.seed_failure(0, SOURCE, sink(stdout="seeded: entries=1237 linked=37 unlogged_skipped=2"))
    assert short is not None and "1237" in short
    assert mur.seed_failure(2, "tar: write error", sink()) == "the primary's stream failed: tar: write error"
    why = "replica seed failed: checkpoint 0/1 is not the primary's"
    refused = mur.seed_failure(0, SOURCE, sink(1, "", why))
    assert refused == why
    broke = mur.seed_failure(0, SOURCE, RuntimeError("stdin broke"))
    assert broke == "its end of the stream failed: stdin broke"


def test_the_summary_names_how_each_replica_follows() -> None:
    text = mur.summary(["db-2", "db-1"], {"db-3": "its stop could not be run"})
    assert text.startswith("db-1, db-2 keep their data")
    assert "db-3 is re-cloned (its stop could not be run)" in text
    assert mur.summary([], {}) == "no replicas"


def test_the_scripts_carry_their_inputs_quoted() -> None:
    layout = mu.Layout(old_bin="/old/bin", new_home="/new", pgdata="/data/pgdata", work="/data/w")
    script = mur.sink_script(layout, "16", "17", "0/3000060")
    assert "CHECKPOINT=0/3000060\n" in script and "OLD_MAJOR=16\n" in script and "NEW_MAJOR=17\n" in script
    stop = mur.stop_replica_script(layout, "16", "17", None, "psql -h /run -U postgres", 10)
    assert "CHECKPOINT=''\n" in stop and "PSQL='psql -h /run -U postgres'\n" in stop and "WAIT=10\n" in stop
