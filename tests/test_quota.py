"""The TPU and CPU quota checks against a stand-in of the Cloud Quotas API (tests/quota_server.py): their verdicts,
the quota read for each TPU and provisioning and for the run's widest stage of CPU tasks, and that they never stop a
run they cannot check."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from components.lib.errors import InvalidParameter
from components.lib.tpu_catalogue import ON_DEMAND, SPOT, TpuType, tpu_type
from pipelines.quota import (
    CPU_QUOTA,
    ENOUGH,
    MISSING,
    TIMEOUT_SECONDS,
    TPU_QUOTAS,
    UNKNOWN,
    VIEWER_ROLE,
    QuotaArguments,
    check_cpu_quota,
    check_tpu_quota,
    require_cpu_quota,
)
from tests.quota_server import QuotaStandIn, StoredQuota

PROJECT, REGION = "my-project", "us-central1"
V5E = TPU_QUOTAS["v5e", ON_DEMAND]
V5E_SPOT = TPU_QUOTAS["v5e", SPOT]
CONSOLE = f"https://console.cloud.google.com/iam-admin/quotas?project={PROJECT}&service=aiplatform.googleapis.com"


def stand_in(quota_id: str, limit: int, **options: object) -> QuotaStandIn:
    """A project with ``limit`` of ``quota_id`` in REGION and none elsewhere."""
    return QuotaStandIn(PROJECT, {quota_id: StoredQuota({REGION: limit})}, **options)


def test_enough_quota() -> None:
    with stand_in(V5E.quota_id, 8) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert (check.verdict, check.limit, check.needed, check.unit) == (ENOUGH, 8, 4, "chips")
    assert check.message.endswith("enough")


@pytest.mark.parametrize("limit", [0, 3])
def test_missing_quota_names_it_its_region_and_where_to_request_it(limit: int) -> None:
    """A 0 comes as a DimensionsInfo without a value, as proto3 JSON leaves it out."""
    with stand_in(V5E.quota_id, limit) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert (check.verdict, check.limit, check.needed) == (MISSING, limit, 4)
    assert V5E.quota_id in check.message and REGION in check.message
    assert f"{CONSOLE}&metric={V5E.metric}" in check.message


def test_a_region_without_a_limit_of_its_own_has_the_default() -> None:
    quotas = {V5E.quota_id: StoredQuota({"us-west4": 0}, default=16, display_name="TPU v5e chips")}
    with QuotaStandIn(PROJECT, quotas) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-16"), ON_DEMAND, endpoint=server.url)
        in_west4 = check_tpu_quota(PROJECT, "us-west4", tpu_type("v5e-16"), ON_DEMAND, endpoint=server.url)
    assert (check.verdict, check.limit) == (ENOUGH, 16)
    assert check.quota_name == f'"TPU v5e chips" ({V5E.quota_id})'  # the API's display name
    assert (in_west4.verdict, in_west4.limit) == (MISSING, 0)


def test_spot_reads_the_spot_quota() -> None:
    quotas = {V5E.quota_id: StoredQuota({REGION: 0}), V5E_SPOT.quota_id: StoredQuota({REGION: 4})}
    with QuotaStandIn(PROJECT, quotas) as server:
        spot = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), SPOT, endpoint=server.url)
        on_demand = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert (spot.quota_id, spot.verdict) == (V5E_SPOT.quota_id, ENOUGH)
    assert (on_demand.quota_id, on_demand.verdict) == (V5E.quota_id, MISSING)
    assert [path.rsplit("/", 1)[1] for path in server.requests] == [V5E_SPOT.quota_id, V5E.quota_id]
    assert server.requests[0] == (
        f"/v1/projects/{PROJECT}/locations/global/services/aiplatform.googleapis.com/quotaInfos/{V5E_SPOT.quota_id}"
    )


@pytest.mark.parametrize(
    ("name", "generation", "needed", "unit"),
    [("v3-8", "v3", 8, "cores"), ("v5e-4", "v5e", 4, "chips"), ("v5e-16", "v5e", 16, "chips")],
)
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_each_tpu_asks_for_its_cores_or_chips(name: str, generation: str, needed: int, unit: str) -> None:
    quota_id = TPU_QUOTAS[generation, ON_DEMAND].quota_id
    for limit, verdict in ((needed, ENOUGH), (needed - 1, MISSING)):
        with stand_in(quota_id, limit) as server:
            check = check_tpu_quota(PROJECT, REGION, tpu_type(name), ON_DEMAND, endpoint=server.url)
        assert (check.quota_id, check.needed, check.unit, check.verdict) == (quota_id, needed, unit, verdict)


def test_unlimited_is_enough() -> None:
    with stand_in(V5E.quota_id, -1) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-32"), ON_DEMAND, endpoint=server.url)
    assert (check.verdict, check.limit) == (ENOUGH, -1)
    assert "unlimited" in check.message


def test_permission_denied_is_unknown_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    with stand_in(V5E.quota_id, 8, denied=True) as server, caplog.at_level(logging.WARNING, "tpu_mlm.quota"):
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert (check.verdict, check.limit) == (UNKNOWN, None)
    assert "the run goes on" in check.message and "403 PERMISSION_DENIED" in check.message
    assert "cloudquotas.quotas.get" in check.message and VIEWER_ROLE in check.message
    assert caplog.messages == [check.message]


def test_a_disabled_api_is_unknown_and_says_how_to_enable_it() -> None:
    with stand_in(V5E.quota_id, 8, api_disabled=True) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert check.verdict == UNKNOWN
    assert "Cloud Quotas API has not been used" in check.message and "Enable it by visiting" in check.message
    assert VIEWER_ROLE not in check.message  # a permission would not help


def test_an_unknown_quota_id_is_unknown() -> None:
    with QuotaStandIn(PROJECT, {}) as server:
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v3-8"), SPOT, endpoint=server.url)
    assert check.verdict == UNKNOWN
    assert "404 NOT_FOUND" in check.message and TPU_QUOTAS["v3", SPOT].quota_id in check.message
    assert check.message.endswith(f"see {CONSOLE}")  # no metric known to filter on


def test_a_region_the_quota_does_not_cover_is_unknown() -> None:
    with stand_in(V5E.quota_id, 8) as server:
        check = check_tpu_quota(PROJECT, "antarctica-south1", tpu_type("v5e-4"), ON_DEMAND, endpoint=server.url)
    assert check.verdict == UNKNOWN and "it has no value for antarctica-south1" in check.message


def test_an_unreachable_endpoint_is_unknown_within_the_timeout() -> None:
    with socket.socket() as probe:  # bound, never listening: refused, and no other process can take the port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        started = time.monotonic()
        check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND, endpoint=f"http://127.0.0.1:{port}")
        assert time.monotonic() - started < TIMEOUT_SECONDS
    assert check.verdict == UNKNOWN and f"could not connect to 127.0.0.1:{port}" in check.message


def test_no_credentials_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Google's endpoint, and application default credentials that name a file that is not there: the check stops
    at the credentials, before any request."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    check = check_tpu_quota(PROJECT, REGION, tpu_type("v5e-4"), ON_DEMAND)
    assert check.verdict == UNKNOWN and "no Google credentials" in check.message


def test_a_tpu_without_a_known_quota_is_unknown() -> None:
    v5p = TpuType("v5p-8", "ct5p-hightpu-4t", "", 0, "2x2x1", 4, 459.0, 95.0, 16.8, 0.0)
    check = check_tpu_quota(PROJECT, REGION, v5p, ON_DEMAND, endpoint="http://127.0.0.1:9")
    assert check.verdict == UNKNOWN and "TPU_QUOTAS" in check.message


@pytest.mark.parametrize(
    ("num_parts", "limit", "verdict", "fitting_parts"),
    [(16, 256, ENOUGH, 0), (16, -1, ENOUGH, 0), (16, 255, MISSING, 15), (16, 24, MISSING, 1), (1, 8, MISSING, 0)],
)
def test_the_cpu_quota_must_hold_every_shards_task_at_once(num_parts, limit, verdict, fitting_parts) -> None:
    """16 parts are 2 x 16 shards tasks of 8 vCPUs side by side: 256 vCPUs of the region's custom-training CPU quota,
    read as the TPU's is; too small a limit names the most parts that fit (none: even one part's 16 vCPUs do not)."""
    with stand_in(CPU_QUOTA.quota_id, limit) as server:
        check = check_cpu_quota(PROJECT, REGION, num_parts, endpoint=server.url)
    assert (check.quota_id, check.needed, check.verdict, check.fitting_parts) == (
        CPU_QUOTA.quota_id,
        16 * num_parts,
        verdict,
        fitting_parts,
    )
    assert f"shards: 2 x {num_parts} part(s) at once) holds {16 * num_parts} vCPUs" in check.message
    if verdict == MISSING:
        assert f"{REGION} is {limit} vCPUs" in check.message and f"metric={CPU_QUOTA.metric}" in check.message


def test_a_cpu_quota_too_small_refuses_the_run_in_one_line_naming_what_to_change() -> None:
    """Fewer parts where some fit (num_parts named), another region where none does (region named); enough, or
    --skip_quota_check, goes on."""
    with stand_in(CPU_QUOTA.quota_id, 24) as server:
        arguments = QuotaArguments(quota_endpoint=server.url)
        with pytest.raises(InvalidParameter) as fewer_parts:
            require_cpu_quota(arguments, PROJECT, REGION, 16)
        assert require_cpu_quota(arguments, PROJECT, REGION, 1).verdict == ENOUGH
        assert require_cpu_quota(QuotaArguments(skip_quota_check=True), PROJECT, REGION, 16) is None
    with stand_in(CPU_QUOTA.quota_id, 8) as server, pytest.raises(InvalidParameter) as other_region:
        require_cpu_quota(QuotaArguments(quota_endpoint=server.url), PROJECT, REGION, 1)
    refused = str(fewer_parts.value)
    assert refused.startswith("--num-parts=16: CPU quota too small:") and "\n" not in refused
    assert "take at most 1 part(s) (num_parts) or request more at" in refused
    assert refused.endswith("(--skip_quota_check: create the run anyway)")
    assert str(other_region.value).startswith(f"--region='{REGION}': CPU quota too small:")
    assert "take at most" not in str(other_region.value)


def test_an_unread_cpu_quota_lets_the_run_go_on() -> None:
    with QuotaStandIn(PROJECT, {}) as server:  # the id unknown to the service: the inferred id may be wrong
        check = require_cpu_quota(QuotaArguments(quota_endpoint=server.url), PROJECT, REGION, 16)
    assert check.verdict == UNKNOWN and "404 NOT_FOUND" in check.message and "the run goes on" in check.message
