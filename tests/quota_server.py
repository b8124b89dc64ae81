"""A local stand-in for the Cloud Quotas API's ``quotaInfos.get``, enough for ``pipelines.quota``: GET
/v1/projects/{project}/locations/global/services/{service}/quotaInfos/{quotaId} answers the project's QuotaInfo, with a
DimensionsInfo for each region that has its own limit and a default one (no ``region`` dimension) for the others.

As strict as the real API where a client can tell: QuotaInfos live in the ``global`` location only; an int64 is a
JSON string and a 0 is left out (proto3 JSON); errors are Google's JSON (``code``, ``message``, ``status``,
``details`` with a ``google.rpc.ErrorInfo``), a 403 for a caller without ``cloudquotas.quotas.get`` (``denied``) or a
project whose Cloud Quotas API is disabled (``api_disabled``), a 404 for a quota id the service does not have; a path
of another shape gets the front end's HTML 404. ``requests`` lists the paths asked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from http_stand_in import serving_thread

SERVICE = "aiplatform.googleapis.com"
QUOTA_INFO_PATH = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/services/([^/]+)/quotaInfos/([^/?]+)")
# the regions a default DimensionsInfo lists as applicable, besides those with a limit of their own
REGIONS = ("us-central1", "us-east1", "us-west1", "us-west4", "us-south1", "europe-west4", "asia-southeast1")


@dataclass
class StoredQuota:
    """One quota of the service: the project's limit in regions of their own, and everywhere else."""

    limits: dict[str, int] = field(default_factory=dict)
    default: int = 0
    display_name: str = ""
    metric: str = ""


class Refused(Exception):
    """An error the Cloud Quotas API would answer: HTTP status, google.rpc status, message and ErrorInfo."""

    def __init__(self, code: int, status: str, message: str, error_info: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.error_info = code, status, error_info


class QuotaStandIn:
    """``quotas``: the service's quotas by id, for ``project`` (its id; ``project_number`` is taken too)."""

    def __init__(
        self,
        project: str,
        quotas: dict[str, StoredQuota],
        project_number: str = "123456789012",
        denied: bool = False,
        api_disabled: bool = False,
    ) -> None:
        self.project, self.project_number, self.quotas = project, project_number, quotas
        self.denied, self.api_disabled = denied, api_disabled
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = serving_thread(self._server)

    def __enter__(self) -> QuotaStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def quota_info(self, project: str, location: str, service: str, quota_id: str) -> dict:
        """The QuotaInfo, or the error the API answers, in the order it checks."""
        name = f"projects/{project}/locations/{location}/services/{service}/quotaInfos/{quota_id}"
        if self.api_disabled:
            raise Refused(
                403,
                "PERMISSION_DENIED",
                f"Cloud Quotas API has not been used in project {self.project_number} before or it is disabled. "
                f"Enable it by visiting {self._activation_url()} then retry. If you enabled this API recently, wait "
                "a few minutes for the action to propagate to our systems and retry.",
                {
                    "reason": "SERVICE_DISABLED",
                    "domain": "googleapis.com",
                    "metadata": {
                        "service": "cloudquotas.googleapis.com",
                        "consumer": f"projects/{self.project_number}",
                        "activationUrl": self._activation_url(),
                    },
                },
            )
        if self.denied or project not in (self.project, self.project_number):
            raise Refused(
                403,
                "PERMISSION_DENIED",
                f"Permission 'cloudquotas.quotas.get' denied on resource '//cloudquotas.googleapis.com/{name}' "
                "(or it may not exist).",
                {
                    "reason": "IAM_PERMISSION_DENIED",
                    "domain": "cloudquotas.googleapis.com",
                    "metadata": {"permission": "cloudquotas.quotas.get", "resource": name},
                },
            )
        if location != "global":
            raise Refused(400, "INVALID_ARGUMENT", f"{name}: the ID component following locations/ must be global")
        if service != SERVICE or quota_id not in self.quotas:
            raise Refused(404, "NOT_FOUND", f"QuotaInfo {quota_id!r} does not exist in the service {service!r}.")
        quota = self.quotas[quota_id]
        others = [region for region in REGIONS if region not in quota.limits]
        infos = [
            {"dimensions": {"region": region}, "details": details(value), "applicableLocations": [region]}
            for region, value in quota.limits.items()
        ]
        infos.append({"details": details(quota.default), "applicableLocations": others})
        return {
            "name": name,
            "quotaId": quota_id,
            "metric": quota.metric,
            "service": service,
            "isPrecise": True,
            "containerType": "PROJECT",
            "dimensions": ["region"],
            "metricDisplayName": quota.display_name,
            "quotaDisplayName": quota.display_name,
            "metricUnit": "1",
            "quotaIncreaseEligibility": {"isEligible": True},
            "dimensionsInfos": infos,
        }

    def _activation_url(self) -> str:
        return f"https://console.developers.google.com/apis/api/cloudquotas.googleapis.com/overview?project={self.project_number}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                stand_in.requests.append(self.path)
                match = QUOTA_INFO_PATH.fullmatch(self.path.partition("?")[0])
                if not match:  # Google's front end: an HTML page, not an API error
                    page = f"<html><body>The requested URL <code>{self.path}</code> was not found on this server."
                    return self._reply(404, page.encode(), "text/html; charset=UTF-8")
                try:
                    info = stand_in.quota_info(*match.groups())
                except Refused as refused:
                    error = {"code": refused.code, "message": str(refused), "status": refused.status}
                    if refused.error_info:
                        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", **refused.error_info}]
                    return self._reply(refused.code, json.dumps({"error": error}).encode(), "application/json")
                self._reply(200, json.dumps(info).encode(), "application/json")

        return Handler


def details(value: int) -> dict:
    """QuotaDetails as proto3 JSON: the int64 as a string, left out when 0."""
    return {"value": str(value)} if value else {}
