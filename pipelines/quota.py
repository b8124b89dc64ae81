"""The TPU's Vertex AI custom-training quota in the run's region, read before a submission sends anything: a job on a
TPU without quota waits queued (a day, then it is cancelled) after the pipeline has paid for its CPU data steps. And
the region's custom-training CPU quota, which every CPU task of the pipeline takes (Vertex AI Pipelines runs each
task as a custom job): a run whose widest stage (the shards step's 2 x num_parts tasks of 8 vCPUs) it cannot hold is
refused, before its tokenizer is paid for.

The check reads the quota's limit through the Cloud Quotas API and compares it with what the TPU takes. It never
stops a run it cannot check: without credentials, without permission, with the API disabled, with a quota id the
service does not know or with no answer in time, it says what it could not read and why, and the run goes on. It
compares with the limit, not with what is free: jobs already running on the quota are not counted.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from components.lib.errors import InvalidParameter, first_line
from components.lib.tpu_catalogue import ON_DEMAND, SPOT, TpuType
from pipelines.vertex_jobs import api_session, chain_post_init, check_endpoint, check_region

log = logging.getLogger("tpu_mlm.quota")

SERVICE = "aiplatform.googleapis.com"
CLOUD_QUOTAS_ENDPOINT = "cloudquotas.googleapis.com"
# each of connecting, a token's refresh and the answer; finding no credentials on a machine outside Google Cloud takes
# google-auth's probes of the metadata server (3 s each, GCE_METADATA_TIMEOUT)
TIMEOUT_SECONDS = 10.0
# quotaInfos.get needs cloudquotas.quotas.get on the project, https://cloud.google.com/docs/quotas/reference/rest/v1/
# projects.locations.services.quotaInfos/get; the predefined role that carries it is Cloud Quotas Viewer
VIEWER_ROLE = "roles/cloudquotas.viewer"
CONSOLE_QUOTAS = "https://console.cloud.google.com/iam-admin/quotas"
ENOUGH, MISSING, UNKNOWN = "enough", "missing", "unknown"
# a limit of -1 is unlimited (google.api.QuotaLimit, https://cloud.google.com/ruby/docs/reference/
# google-cloud-service_usage-v1/latest/Google-Api-QuotaLimit)
UNLIMITED = -1


@dataclass(frozen=True)
class TrainingQuota:
    """A Vertex AI custom-training quota (a TPU's, the CPUs'): its Cloud Quotas id, the unit it counts, and its
    display name and metric where a page read gave them ("" where none did: the API's answer gives them)."""

    quota_id: str
    unit: str  # "cores": TensorCores, two a v3 chip; "chips": one TensorCore a v5e chip (the quota calls them cores)
    display_name: str = ""
    metric: str = ""

    def need(self, tpu: TpuType) -> int:
        """What a job on ``tpu`` takes of the quota: a v3's cores as its machine spec counts them (v3-8: 8), a
        v5e's chips, from its topology (2x2: 4, 4x4: 16)."""
        if self.unit == "chips":
            return math.prod(int(side) for side in tpu.topology.split("x"))
        return tpu.accelerator_count


# The quotas a TPU job of this pipeline takes, by TPU generation and Vertex AI scheduling strategy: the one table to
# correct when Vertex AI renames a quota. Vertex AI's own list, https://cloud.google.com/vertex-ai/docs/quotas, came
# here only as its first paragraphs, without its TPU rows, so the table rests on Google's code and other pages:
# - ids: https://github.com/GoogleCloudPlatform/vertex-ai-samples/blob/main/notebooks/community/model_garden/
#   docker_source_codes/notebook_util/common_util.py, get_quota_id: "CustomModelTraining" + "V3TPUs" / "V5ETPU" +
#   "PerProjectPerRegion", and "CustomModelTrainingPreemptible..." (used there for Dynamic Workload Scheduler jobs);
#   the Google Cloud SDK's googlecloudsdk/command_lib/ai/model_garden_utils.py reads the same pattern's
#   CustomModelServingV5ETPUPerProjectPerRegion through Cloud Quotas.
# - metrics: the same file's earlier version filters Service Usage on aiplatform.googleapis.com/
#   custom_model_training_tpu_v3 and .../custom_model_training_tpu_v5e. No Spot TPU metric was found.
# - display name: "Custom model training TPU V3 cores per region", https://github.com/google-research/t5x README
#   (its "pod cores" quota is another one, for multi-host v3, which a v3-8 does not use). The v5e's was not found.
# - units: Cloud TPU counts v2/v3 quota in TensorCores (https://cloud.google.com/tpu/docs/quota), and the t5x README
#   calls the default Vertex AI v3 quota of 8 cores enough for one TPU host: a v3-8 takes 8. A v5e chip has one
#   TensorCore, so its "cores" are chips: the SDK file above checks a ct5lp-hightpu-4t against 4 of its quota.
# - Spot: Vertex AI Spot jobs take the "preemptible" quotas (users' reports for GPUs, "Custom model training
#   preemptible ... GPUs per region"). That the Spot TPU ids below exist is inferred from the pattern, not confirmed,
#   and whether a multi-host v5e slice takes the single-host quota was not found either. A wrong id answers 404 and
#   the check says "unknown": it never guesses "missing".
TPU_QUOTAS: dict[tuple[str, str], TrainingQuota] = {
    ("v3", ON_DEMAND): TrainingQuota(
        "CustomModelTrainingV3TPUsPerProjectPerRegion",
        "cores",
        "Custom model training TPU V3 cores per region",
        f"{SERVICE}/custom_model_training_tpu_v3",
    ),
    ("v3", SPOT): TrainingQuota("CustomModelTrainingPreemptibleV3TPUsPerProjectPerRegion", "cores"),
    ("v5e", ON_DEMAND): TrainingQuota(
        "CustomModelTrainingV5ETPUPerProjectPerRegion", "chips", metric=f"{SERVICE}/custom_model_training_tpu_v5e"
    ),
    ("v5e", SPOT): TrainingQuota("CustomModelTrainingPreemptibleV5ETPUPerProjectPerRegion", "chips"),
}
# The CPUs of the pipeline's CPU tasks, each a custom job of Vertex AI Pipelines on the machine its CPU limit sizes.
# - metric: aiplatform.googleapis.com/custom_model_training_cpus, the one users quote from Vertex AI's refusal of a
#   CPU training job ("429 RESOURCE_EXHAUSTED ... The following quota metrics exceed quota limits: aiplatform.
#   googleapis.com/custom_model_training_cpus"), e.g. github.com/himanshusdeshmukh2106/tr, AlgoTrading/LSTM_strategy/
#   QUOTA_CHECK_RESULTS.md; display name "Custom model training CPUs per region", as the console shows it there.
# - id: inferred from the pattern of the TPU ids above (CustomModelTraining + what it counts + PerProjectPerRegion);
#   no page or code that names it was found. A wrong id answers 404 and the check says "unknown", never "missing".
# - whether pipeline tasks count there as training jobs do, and whether a machine family of its own (N2, C2, ...)
#   takes another quota, was not found either: the tasks run on Vertex AI's default family for their CPU limit.
CPU_QUOTA = TrainingQuota(
    "CustomModelTrainingCPUsPerProjectPerRegion",
    "vCPUs",
    "Custom model training CPUs per region",
    f"{SERVICE}/custom_model_training_cpus",
)


@dataclass(frozen=True)
class QuotaCheck:
    """What the check found: the quota it looked at, its limit in the region (None: not read; -1: unlimited), what
    the TPU needs of it, the verdict (enough, missing or unknown) and the line that says so."""

    quota_id: str
    quota_name: str
    region: str
    limit: int | None
    needed: int
    unit: str
    verdict: str
    message: str


@dataclass(kw_only=True)
class QuotaArguments:
    """The quota check of a command that creates a TPU job (submit, smoke)."""

    skip_quota_check: bool = field(
        default=False,
        metadata={"help": "Create the TPU job even where the TPU's quota in the region was read and is missing."},
    )
    quota_endpoint: str = field(
        default="", metadata={"help": f"The Cloud Quotas API's endpoint; default: {CLOUD_QUOTAS_ENDPOINT}."}
    )

    def __post_init__(self) -> None:
        check_endpoint("quota_endpoint", self.quota_endpoint)
        chain_post_init(QuotaArguments, self)


def require_tpu_quota(
    arguments: QuotaArguments, project: str, region: str, tpu: TpuType, provisioning: str, credentials: Any = None
) -> QuotaCheck | None:
    """The quota check before a TPU job is created: an on-demand quota read and missing refuses the job in one line
    (unless --skip_quota_check); a Spot one only warns (its quota ids are inferred, TPU_QUOTAS); one that cannot be
    read lets it go on."""
    if arguments.skip_quota_check:
        return None
    check = check_tpu_quota(project, region, tpu, provisioning, arguments.quota_endpoint, credentials)
    if check.verdict == MISSING and provisioning != SPOT:
        raise InvalidParameter("tpu_type", tpu.name, f"{check.message} (--skip_quota_check: create the job anyway)")
    return check


@dataclass(frozen=True)
class CpuQuotaCheck(QuotaCheck):
    """A CPU quota check, and the most parts a run could take within the limit read (0: none, or not read)."""

    fitting_parts: int = 0


class QuotaRefused(Exception):
    """The Cloud Quotas API answered with an error; the message is its one-line reason."""


def check_tpu_quota(
    project: str, region: str, tpu: TpuType, provisioning: str, endpoint: str = "", credentials: Any = None
) -> QuotaCheck:
    """Whether ``project`` has the Vertex AI quota for a job on ``tpu`` in ``region`` with ``provisioning`` (STANDARD
    or SPOT), read from the Cloud Quotas API at ``endpoint`` (default: Google's; an ``http://`` endpoint is a local
    stand-in, reached without credentials) as ``credentials`` (default: the application default credentials).
    Logs its line (a warning unless enough) and never raises for a quota it cannot read."""
    generation = tpu.name.split("-")[0]
    kind = "Spot" if provisioning == SPOT else "on-demand"
    quota = TPU_QUOTAS.get((generation, provisioning))
    if quota is None:
        message = (
            f"TPU quota not checked, the run goes on: no Vertex AI quota is known for a {kind} {tpu.name} "
            f"(TPU_QUOTAS in pipelines/quota.py); see {console_url(project, '')}"
        )
        log.warning(message)
        return QuotaCheck("", "", region, None, 0, "", UNKNOWN, message)
    needed = quota.need(tpu)
    info, limit, reason = read_region_limit(project, region, quota, endpoint, credentials)
    name = quota_name(quota, info.get("quotaDisplayName", ""))
    url = console_url(project, info.get("metric") or quota.metric)
    need = f"the {tpu.name} ({kind}) needs {needed} {quota.unit}"
    if limit is None:
        verdict = UNKNOWN
        message = (
            f"TPU quota not checked, the run goes on: could not read {name} in {region} ({reason}); {need}; see {url}"
        )
    elif limit == UNLIMITED or limit >= needed:
        verdict = ENOUGH
        limit_text = "unlimited" if limit == UNLIMITED else f"{limit} {quota.unit}"
        message = f"TPU quota: {name} in {region} is {limit_text}, {need}: enough"
    else:
        verdict = MISSING
        message = (
            f"TPU quota missing: {name} in {region} is {limit} {quota.unit}, {need}: its job would wait queued until "
            f"cancelled; request the quota at {url}"
        )
    log.log(logging.INFO if verdict == ENOUGH else logging.WARNING, message)
    return QuotaCheck(quota.quota_id, name, region, limit, needed, quota.unit, verdict, message)


def read_region_limit(
    project: str, region: str, quota: TrainingQuota, endpoint: str, credentials: Any
) -> tuple[dict[str, Any], int | None, str]:
    """The quota's QuotaInfo, its limit in ``region`` (None: not read) and, where there is none, why. A region or an
    endpoint of another form is refused, not taken for a quota that cannot be read."""
    check_region(region)
    check_endpoint("quota_endpoint", endpoint)
    try:
        info = read_quota_info(project, quota.quota_id, endpoint, credentials)
        limit = region_limit(info, region)
    except Exception as error:  # a check that cannot read the quota lets the run go on, whatever stopped it
        return {}, None, unreadable(error)
    return info, limit, f"it has no value for {region}"


def require_cpu_quota(
    arguments: QuotaArguments, project: str, region: str, num_parts: int, credentials: Any = None
) -> QuotaCheck | None:
    """The CPU quota check before a pipeline run is created: a limit read that cannot hold the run's widest stage
    of CPU tasks refuses the run in one line (unless --skip_quota_check); one that cannot be read lets it go on."""
    if arguments.skip_quota_check:
        return None
    check = check_cpu_quota(project, region, num_parts, arguments.quota_endpoint, credentials)
    if check.verdict == MISSING:
        parameter, value = ("num_parts", num_parts) if check.fitting_parts else ("region", region)
        raise InvalidParameter(parameter, value, f"{check.message} (--skip_quota_check: create the run anyway)")
    return check


def check_cpu_quota(
    project: str, region: str, num_parts: int, endpoint: str = "", credentials: Any = None
) -> CpuQuotaCheck:
    """Whether the region's custom-training CPU quota holds the run's widest stage of CPU tasks (``peak_cpus``),
    read as ``check_tpu_quota`` reads a TPU's; ``fitting_parts``: the most parts a run there could take (0: none)."""
    from pipelines.pipeline import peak_cpus

    widest, needed = peak_cpus(num_parts)
    info, limit, reason = read_region_limit(project, region, CPU_QUOTA, endpoint, credentials)
    name = quota_name(CPU_QUOTA, info.get("quotaDisplayName", ""))
    url = console_url(project, info.get("metric") or CPU_QUOTA.metric)
    need = f"the run's widest stage ({widest}) holds {needed} vCPUs at once"
    fitting = 0
    if limit is None:
        verdict = UNKNOWN
        message = f"CPU quota not checked, the run goes on: could not read {name} in {region} ({reason}); {need}"
    elif limit == UNLIMITED or limit >= needed:
        verdict = ENOUGH
        message = f"CPU quota: {name} in {region} is {'unlimited' if limit == UNLIMITED else limit}, {need}: enough"
    else:
        verdict = MISSING
        fitting = max((parts for parts in range(1, num_parts) if peak_cpus(parts)[1] <= limit), default=0)
        fewer = f"take at most {fitting} part(s) (num_parts) or " if fitting else ""
        message = (
            f"CPU quota too small: {name} in {region} is {limit} vCPUs, {need}: the tasks past it fail or wait; "
            f"{fewer}request more at {url}"
        )
    log.log(logging.INFO if verdict == ENOUGH else logging.WARNING, message)
    return CpuQuotaCheck(CPU_QUOTA.quota_id, name, region, limit, needed, CPU_QUOTA.unit, verdict, message, fitting)


def quota_name(quota: TrainingQuota, display_name: str) -> str:
    """The quota as a person finds it in the console (its display name) and as the API names it (its id)."""
    display_name = display_name or quota.display_name
    return f'"{display_name}" ({quota.quota_id})' if display_name else quota.quota_id


def console_url(project: str, metric: str) -> str:
    """The console's quota page for the project, filtered to Vertex AI's quotas and to ``metric`` when known (the
    ``service``/``metric`` query Google's own docs link quotas with, e.g. BigQuery's "View your slot quotas")."""
    query = {"project": project, "service": SERVICE} | ({"metric": metric} if metric else {})
    return f"{CONSOLE_QUOTAS}?{urlencode(query, safe='/')}"


def quota_info_url(project: str, quota_id: str, endpoint: str) -> str:
    """Cloud Quotas' quotaInfos.get of a Vertex AI quota: QuotaInfos live in the ``global`` location."""
    base = endpoint or CLOUD_QUOTAS_ENDPOINT
    base = base if "://" in base else f"https://{base}"
    return f"{base.rstrip('/')}/v1/projects/{project}/locations/global/services/{SERVICE}/quotaInfos/{quota_id}"


def read_quota_info(project: str, quota_id: str, endpoint: str, credentials: Any) -> dict[str, Any]:
    """The QuotaInfo of ``quota_id`` (raises ``QuotaRefused`` with the API's reason when it answers an error)."""
    with api_session(endpoint, credentials, "quota_endpoint") as session:
        response = session.get(quota_info_url(project, quota_id, endpoint), timeout=TIMEOUT_SECONDS)
    if response.status_code != 200:
        raise QuotaRefused(refusal(response))
    return response.json()


def refusal(response: Any) -> str:
    """An error answer in one line: its HTTP status, google.rpc status and message, and what to do about a denied
    permission (an API that is disabled says in its message how to enable it) or an unknown quota id."""
    try:
        error = response.json()["error"]
        status, message = error["status"], " ".join(str(error["message"]).split()).rstrip(".")
    except (ValueError, KeyError, TypeError):  # not Google's error JSON (a proxy's page)
        return f"HTTP {response.status_code}"
    reasons = [detail.get("reason") for detail in error.get("details", []) if isinstance(detail, dict)]
    line = f"{response.status_code} {status}: {message}"
    if status == "PERMISSION_DENIED" and "SERVICE_DISABLED" not in reasons:
        line += f"; reading it needs cloudquotas.quotas.get on the project ({VIEWER_ROLE})"
    elif status == "NOT_FOUND":
        line += "; the id in TPU_QUOTAS (pipelines/quota.py) may be wrong"
    return line


def unreadable(error: Exception) -> str:
    """Why the quota could not be read, in one line."""
    import requests
    from google.auth.exceptions import DefaultCredentialsError

    if isinstance(error, QuotaRefused):
        return str(error)
    if isinstance(error, DefaultCredentialsError):
        return f"no Google credentials: {first_line(error)}"
    if isinstance(error, requests.Timeout):
        return f"no answer within {TIMEOUT_SECONDS:g} s"
    if isinstance(error, requests.ConnectionError):
        host = urlsplit(error.request.url).netloc if error.request is not None else "the Cloud Quotas API"
        return f"could not connect to {host}"
    return f"{type(error).__name__}: {first_line(error)}"


def region_limit(info: dict[str, Any], region: str) -> int | None:
    """The quota's limit in ``region``: from the first of its dimensionsInfos (ordered from the most specific) that
    applies there, the region's own or the default one without a region (https://cloud.google.com/python/docs/
    reference/google-cloud-cloudquotas/latest/google.cloud.cloudquotas_v1.types.QuotaInfo, DimensionsInfo); None when
    none applies. The int64 value is a JSON string, left out when 0, as proto3 JSON leaves out defaults."""
    for dimensions_info in info.get("dimensionsInfos", []):
        dimensions = dimensions_info.get("dimensions", {})
        if set(dimensions) - {"region"}:
            continue  # a service-specific dimension: not what a TPU job is counted on
        locations = dimensions_info.get("applicableLocations", [])
        applies = dimensions["region"] == region if "region" in dimensions else not locations or region in locations
        if applies:
            return int(dimensions_info.get("details", {}).get("value", 0))
    return None
