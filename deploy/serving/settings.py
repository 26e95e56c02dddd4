"""The policy server's settings: batching and request limits (`BatchSettings`, changeable live
through the deployment's `user_config`), and the app builder's arguments (`AppArgs`, the fields
of `huggy serve` and of a Serve config file's `args`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deploy.serving.catalogue import PolicySet, catalogue
from huggy_agent.agent import bundled_policy_path
from huggy_agent.formats.results import resolve_results_folder
from huggy_agent.formats.sources import is_hub_source, resolve_policy_source
from huggy_agent_client.http_api import load_api_key


@dataclass(frozen=True)
class BatchSettings:
    """Batching and request limits; also the deployment's `user_config` (changeable live)."""

    max_batch_size: int = 256
    """Most observations (rows, over all requests) in one forward pass."""
    batch_wait_timeout_s: float = 0.0
    """How long a batch waits for more requests after its first; 0 takes what is queued."""
    max_rows: int = 256
    """Most observations in one request (413 above); at most `max_batch_size`."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted (413 above)."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BatchSettings:
        """Settings from a `user_config` dict; the keys not given keep their defaults.

        Args:
            config: setting name -> value.

        Returns:
            The settings.

        Raises:
            ValueError: an unknown key, a count that is not an integer >= 1, a wait outside [0, 10],
                or `max_rows` above `max_batch_size` (naming it).
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValueError(f"unknown batch setting(s) {unknown}; expected {sorted(names)}")
        settings = cls(**{**asdict(cls()), **config})
        for name in ("max_batch_size", "max_rows", "max_body_bytes"):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, received {value!r}")
        wait = settings.batch_wait_timeout_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 10:
            raise ValueError(f"batch_wait_timeout_s must be a number in [0, 10], received {wait!r}")
        if settings.max_rows > settings.max_batch_size:
            raise ValueError(f"max_rows ({settings.max_rows}) must not exceed max_batch_size "
                             f"({settings.max_batch_size}): a request is never split over batches")
        return settings


def split_user_config(config: dict[str, Any]) -> tuple[BatchSettings, PolicySet | None]:
    """A deployment's `user_config`, taken apart.

    Args:
        config: batch settings (keys of `BatchSettings`) and, optionally, the policies
            (`PolicySet.as_config` keys).

    Returns:
        The batch settings, and the policies (None where absent).

    Raises:
        ValueError: `default` or `split` without `policies`, or a bad key or value (naming it).
    """
    config = dict(config or {})
    policy_keys = ("policies", "default", "split")
    policies = ({key: config.pop(key) for key in policy_keys if key in config}
                if "policies" in config else None)
    stray = sorted(key for key in policy_keys if key in config)
    if stray:
        raise ValueError(f"{stray} given without 'policies'")
    return BatchSettings.from_config(config), (None if policies is None
                                               else PolicySet.from_config(policies))


class AppArgs(BaseModel):
    """Arguments of the app builder (`serve run deploy.serving.app:app key=value ...`, or a config)."""

    model_config = ConfigDict(extra="forbid")

    policy: str | None = Field(None, description="one policy: a .onnx, .pt, results folder (its "
                               "final export) or hf:// source; None: bundled (unless policies)")
    policies: list[str] = Field(default_factory=list, description=(
        "several policies: files, results folders (every checkpoint, as `huggy evaluate` "
        "takes them) or hf:// sources; ids as `huggy evaluate` labels them"))
    default: str | None = Field(None, description="id that /v1/act answers with; None: the first")
    split: str | dict[str, float] | None = Field(None, description=(
        "A/B split of /v1/act: 'ID=WEIGHT,ID=WEIGHT' or {id: weight}; changeable by redeploy"))
    models_per_replica: int | None = Field(None, ge=1, description=(
        "most policies a replica holds (least recently used evicted); None: all"))
    accelerator: Literal["auto", "cpu", "gpu", "npu"] = "auto"
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    replicas: int = Field(1, ge=1, description="fixed number of replicas (without autoscale)")
    autoscale: bool = Field(False, description="scale between 1 and max_replicas on load")
    max_replicas: int = Field(4, ge=1)
    num_cpus: float = Field(1.0, ge=0, description="CPUs each replica holds")
    max_batch_size: int = BatchSettings.max_batch_size
    batch_wait_timeout_s: float = BatchSettings.batch_wait_timeout_s
    max_rows: int = BatchSettings.max_rows
    max_body_bytes: int = BatchSettings.max_body_bytes
    max_ongoing_requests: int = Field(512, ge=1)
    ingress: str = Field("", description="recorded in /v1/info; set by deploy.runner")
    haproxy_folder: str | None = Field(None, description=(
        "huggy serve's HAProxy folder (deploy.serving.haproxy): a replica on the node where it "
        "exists listens on a Unix socket of its own there, where HAProxy sends its requests; "
        "set by huggy serve; None: Serve's HTTP server in the replica only"))
    route_prefix: str = Field("/", description=(
        "the app's route prefix, which the requests through a replica's own listener keep in "
        "their paths; set by huggy serve with haproxy_folder"))
    api_key_file: str | None = Field(None, description="file whose first line is the API key; "
                                     "None: $HUGGY_API_KEY where the app is built, else no key")

    @field_validator("policy")
    @classmethod
    def _existing_policy(cls, policy: str | None) -> str | None:
        """An absolute path (replicas do not share the caller's working directory), or a Hub
        source pinned to the commit it resolves to when the app is built (each replica reads
        its node's cache)."""
        if policy is None:
            return None
        if is_hub_source(policy):
            try:
                return resolve_policy_source(policy).describe()
            except FileNotFoundError as error:
                raise ValueError(str(error)) from None
        path = Path(policy).expanduser().resolve()
        if not path.exists():
            raise ValueError(f"policy {policy!r} not found (resolved to {path})")
        return str(path)

    @field_validator("api_key_file")
    @classmethod
    def _readable_key_file(cls, api_key_file: str | None) -> str | None:
        """An absolute path to a file that holds a key (read again when the app is built)."""
        if api_key_file is None:
            return None
        load_api_key(api_key_file)  # ValueError naming the file: unreadable or empty
        return str(Path(api_key_file).expanduser().resolve())

    @model_validator(mode="after")
    def _valid_batching(self) -> AppArgs:
        self.batch_settings()
        if self.policy is not None and self.policies:
            raise ValueError("give either policy (one) or policies (several), not both")
        return self

    def sources(self) -> list[str]:
        """What to serve, for `deploy.serving.catalogue.catalogue`.

        Returns:
            `policies`, else the one `policy` (a results folder standing for its final export), else
                the bundled policy.

        Raises:
            PolicyLoadError: a results folder with several final exports.
            FileNotFoundError: a results folder without a policy file.
        """
        if self.policies:
            return list(self.policies)
        if self.policy is None:
            return [str(bundled_policy_path())]
        path = resolve_policy_source(self.policy).path
        return [str(resolve_results_folder(path) if path.is_dir() else path)]

    def policy_set(self) -> PolicySet:
        """The served policies (each file loaded for its interface and fingerprint: call once per process
        and pass the result on), the default and the split.

        Returns:
            The set.

        Raises:
            FileNotFoundError: a policy that does not exist.
            ValueError: no policy, a default or split that is wrong (naming what).
            PolicyLoadError: a policy that cannot be loaded.
        """
        return PolicySet.build(catalogue(self.sources()), self.default, self.split)

    def batch_settings(self) -> BatchSettings:
        """The batch settings part of these arguments.

        Returns:
            The validated settings.

        Raises:
            ValueError: as `BatchSettings.from_config` raises.
        """
        return BatchSettings.from_config({f.name: getattr(self, f.name)
                                          for f in fields(BatchSettings)})


def app_args(**values: Any) -> AppArgs:
    """The app builder's arguments, checked.

    Args:
        **values: `AppArgs`' fields.

    Returns:
        `AppArgs(**values)`.

    Raises:
        ValueError: a value is refused, saying what is wrong in words (no pydantic error codes or
            links).
    """
    try:
        return AppArgs(**values)
    except ValidationError as error:
        problems = "; ".join(
            (f"{'.'.join(map(str, item['loc']))}: " if item["loc"] else "")
            + item["msg"].removeprefix("Value error, ")
            for item in error.errors())
        raise ValueError(problems) from None
