"""The major upgrade's decisions: which upgrade a spec asks for, the command lines, pg_upgrade's reason for
a failed check, the write outage. (The phases and their transitions: test_major_upgrade_state.py.)"""

from __future__ import annotations

import pytest

from pg_operator.api.constants import PGDATA
from pg_operator.orchestration import major_upgrade as mu

# What pg_upgrade 17 prints for a live check that finds a reg* column (its layout: a line per check, the
# failing one ending "fatal", then the explanation and the report file).
FAILED_CHECK = """\
Performing Consistency Checks on Old Live Server
------------------------------------------------
Checking cluster versions                                     ok
Checking database user is the install user                    ok
Checking for prepared transactions                            ok
Checking data type usage                                      fatal

Your installation contains one of the reg* data types in user tables.
These data types reference system OIDs that are not preserved by
pg_upgrade, so this cluster cannot currently be upgraded.
    /var/lib/postgresql/data/major-upgrade/pgdata-new/pg_upgrade_output.d/20261202T124500.000/data_types_usage.txt

Failure, exiting
"""


def test_requested_upgrade_only_upwards() -> None:
    assert mu.requested("17", None) is None  # a new cluster
    assert mu.requested("16", "16") is None
    assert mu.requested("18", "16") == mu.UpgradeRequest(old_major="16", new_major="18")
    with pytest.raises(ValueError, match=r"spec\.version 15 is lower than the running major 16"):
        mu.requested("15", "16")
    with pytest.raises(ValueError, match="version 'x16' is not a PostgreSQL version"):
        mu.requested("x16", "16")


def test_major_of_reads_a_major_or_an_exact_version() -> None:
    assert mu.major_of("16") == 16 and mu.major_of("18.6") == 18
    with pytest.raises(ValueError, match=r"'9\.6'"):
        mu.major_of("9.6")


def test_scripts_take_the_layout_and_keep_the_work_beside_pgdata() -> None:
    layout = mu.Layout(old_bin="/usr/lib/postgresql/current/bin", new_home=mu.staged_binaries("18.6"))
    check, upgrade = mu.check_script(layout), mu.upgrade_script(layout, "16", "18")
    assert f"PGDATA={PGDATA}\n" in check and "--check" in check and "--link" not in check
    assert "--link" in upgrade and "OLD_MAJOR=16\nNEW_MAJOR=18\n" in upgrade
    assert "NEW_HOME=/var/lib/postgresql/data/major-upgrade/postgresql-18.6\n" in upgrade
    # Quoted: a path with a space or a quote cannot split into words or end the assignment.
    odd = mu.check_script(mu.Layout(old_bin="/o b/bin", new_home="/n'h"))
    assert "OLD_BIN='/o b/bin'\n" in odd and "NEW_HOME='/n'\"'\"'h'\n" in odd
    # The work directory is beside PGDATA, never inside it (base backups and pg_rewind copy PGDATA).
    assert not layout.work.startswith(PGDATA + "/") and not layout.new_pgdata.startswith(PGDATA + "/")


def test_statistics_carried_over_from_18_analysed_in_stages_before() -> None:
    assert "--missing-stats-only" in mu.statistics_argv("/b", "18")
    assert "--analyze-in-stages" in mu.statistics_argv("/b", "17")
    assert "--missing-stats-only" not in mu.statistics_argv("/b", "17")


def test_check_failure_reason_quotes_the_failing_check() -> None:
    reason = mu.check_failure_reason(FAILED_CHECK)
    assert reason.startswith("Checking data type usage fatal Your installation contains one of the reg*")
    assert "Checking cluster versions" not in reason
    assert "data_types_usage.txt" in reason
    assert len(mu.check_failure_reason(FAILED_CHECK, limit=40)) == 40
    assert mu.check_failure_reason("") == "pg_upgrade --check failed without saying why"


def test_controldata_reads() -> None:
    out = (
        "pg_control version number:            1700\nDatabase system identifier:           7452\n"
        "Data page checksum version:           1\n"
    )
    assert mu.system_identifier(out) == "7452"
    assert mu.controldata_settings(out) == {"checksums": "on"}
    assert mu.controldata_settings(out.replace("version:           1", "version:           0")) == {
        "checksums": "off"
    }
    with pytest.raises(ValueError, match="Database system identifier"):
        mu.system_identifier("nothing")


def test_write_outage() -> None:
    assert mu.write_outage_seconds(10.0, 22.5) == 12.5
    assert mu.write_outage_seconds(None, 3.0) is None
    with pytest.raises(ValueError, match="comes before"):
        mu.write_outage_seconds(5.0, 4.0)


def test_with_backups_the_upgrade_refuses_unarchived_wal_before_anything_changes() -> None:
    layout = mu.Layout(old_bin="/old/bin", new_home="/new")
    plain = mu.upgrade_script(layout, "16", "17")
    guarded = mu.upgrade_script(layout, "16", "17", require_archived=True)
    assert "REQUIRE_ARCHIVED=0" in plain and "REQUIRE_ARCHIVED=1" in guarded
    # The guard runs before pg_upgrade (its failure goes through the roll-back, nothing changed yet).
    assert guarded.index('[ "$REQUIRE_ARCHIVED" = 1 ]') < guarded.index('"$NEW_BIN/pg_upgrade"')


def test_archive_current_switches_and_waits_bounded() -> None:
    script = mu.archive_current_script("psql -h /var/run/postgresql -U postgres -AtX", 120)
    assert script.startswith("PSQL='psql -h /var/run/postgresql -U postgres -AtX'\nWAIT=120\n")
    assert "pg_switch_wal()" in script and "pg_stat_archiver" in script and "exit 1" in script


def test_members_paused_only_when_every_member_says_so() -> None:
    assert mu.members_paused([{"state": "running", "pause": True}, {"state": "streaming", "pause": True}])
    assert not mu.members_paused([{"state": "running", "pause": True}, {"state": "streaming"}])
    assert not mu.members_paused([{"pause": "true"}])  # Patroni writes a JSON boolean
    assert not mu.members_paused([])


def test_the_upgrade_takes_the_checked_cluster_before_any_initdb() -> None:
    layout = mu.Layout(old_bin="/old/bin", new_home="/new", work="/w")
    check, upgrade = mu.check_script(layout), mu.upgrade_script(layout, "16", "17")
    assert layout.prepared_pgdata == "/w/pgdata-prepared"
    # Kept only when the check passed; removed before a new check starts.
    assert 'if [ "$rc" = 0 ]; then mv "$WORK/pgdata-check" "$WORK/pgdata-prepared"' in check
    assert check.index('rm -rf "$WORK/pgdata-check" "$WORK/pgdata-prepared"') < check.index("--check")
    # Used only when it holds the new major; otherwise initdb as before; either way before pg_upgrade.
    taken = upgrade.index('mv "$WORK/pgdata-prepared" "$NEW"')
    assert upgrade.index('= "$NEW_MAJOR" ]') < taken < upgrade.index('new_cluster "$NEW"')
    assert upgrade.index('new_cluster "$NEW"') < upgrade.index('"$NEW_BIN/pg_upgrade"')
