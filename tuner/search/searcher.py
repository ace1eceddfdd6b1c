"""The legacy one-shot search loop (``tuner search`` without the pipeline): one process that builds,
gates, benchmarks, re-measures the baseline anchor, prunes, reaps dead workers and prints progress.

Its configuration, storage and outcome live in :mod:`tuner.search.study`; :func:`tuner.search.study.run_search`
runs a :class:`_Searcher`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import platform
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.errors import TunerError, UsageError
from tuner._hash import stable_hash
from tuner.plan.space import runtime_env_and_args
from tuner.search.record import BASELINE_PARAMS_ATTR, _median, parse_point_key, point_key
from tuner.search.study import PROFILES, SearchConfig, _make_storage

logger = logging.getLogger(__name__)


class _Heartbeat:
    """Records Optuna heartbeats for an ask/tell trial (optimize() would do this for us)."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self._storage, self._trial_id = storage, trial_id
        self._stop = threading.Event()
        interval = getattr(storage, "get_heartbeat_interval", lambda: None)()
        self._thread = None
        if interval:
            self._thread = threading.Thread(target=self._beat, args=(interval,), daemon=True)

    def _beat(self, interval: int) -> None:
        while not self._stop.wait(interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # noqa: BLE001 - a missed beat only risks a retry
                logger.debug("heartbeat failed", exc_info=True)

    def __enter__(self) -> _Heartbeat:
        if self._thread:
            self._storage.record_heartbeat(self._trial_id)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


class _Searcher:
    """One search (or worker) process: owns the study, the caches and the progress display."""

    def __init__(self, cfg: SearchConfig) -> None:
        import optuna

        from tuner.plan.space import load_space
        from tuner.source import fetch_source

        self.cfg = cfg
        self.t0 = time.monotonic()
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self.source = fetch_source(cfg.source_spec)
        self.space = load_space(cfg.arch, self.source.era)
        self.variants = [v for v in self.space.variants if cfg.variants is None or v in cfg.variants]
        if not self.variants:
            raise UsageError(
                f"none of the requested variants {list(cfg.variants or [])} is in the {cfg.arch} space "
                f"for era {self.source.era}; it has {self.space.variants}."
            )
        # --set values arrive as strings: type- and range-check them against the space.
        fixed = {k: (v if k == "variant" else self.space.knob(k).coerce(v)) for k, v in cfg.fixed.items()}
        if "variant" in fixed and fixed["variant"] not in self.space.variants:
            raise UsageError(f"--set variant={fixed['variant']} is not a variant of {cfg.arch}: {self.space.variants}")
        self.cfg = cfg = dataclasses.replace(cfg, fixed=fixed)
        self.storage = _make_storage(cfg.storage_url)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=6, multivariate=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            pruner = optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=2)
        self.study = optuna.create_study(
            study_name=cfg.study,
            storage=self.storage,
            direction="maximize",
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
        )
        self.points = [(ph, d) for ph in ("pp", "tg") for d in cfg.depths]
        self.builds_new = 0
        self.builds_cached = 0
        self._gated: dict[str, dict[str, Any]] = {}
        self._local_archs = self._detect_local()
        self._record_study_attrs()

    # -- setup -----------------------------------------------------------------------------

    @staticmethod
    def _detect_local() -> list[str]:
        from tuner.targets.archs import detect_local_archs

        return detect_local_archs()

    def _record_study_attrs(self) -> None:
        attrs = self.study.user_attrs
        mine = {
            "arch": self.cfg.arch,
            "source_spec": self.source.spec,
            "source_id": self.source.source_id,
            "commit": self.source.commit,
            "era": self.source.era,
            "model": str(self.cfg.model),
            "depths": list(self.cfg.depths),
            "pp": self.cfg.pp,
            "tg": self.cfg.tg,
            "profile": self.cfg.profile,
        }
        if "arch" not in attrs:
            for k, v in mine.items():
                self.study.set_user_attr(k, v)
            return
        # A second process joining the study must tune the same thing.
        for k in ("arch", "source_id", "depths", "pp", "tg"):
            if attrs.get(k) != mine[k]:
                raise UsageError(
                    f"study {self.cfg.study!r} in {self.cfg.storage_url} was created with {k}={attrs.get(k)!r} "
                    f"but this run has {k}={mine[k]!r}. Use another --study name, or the same settings."
                )

    # -- distributions -----------------------------------------------------------------------

    def distributions(self) -> dict[str, Any]:
        import optuna

        dists: dict[str, Any] = {}
        if len(self.variants) > 1 and "variant" not in self.cfg.fixed:
            dists["variant"] = optuna.distributions.CategoricalDistribution(self.variants)
        for k in (*self.space.compile_knobs, *self.space.runtime_knobs):
            if k.name in self.cfg.fixed:
                continue
            dists[k.name] = k.to_optuna_distribution()
        return dists

    def baseline_params(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        if len(self.variants) > 1 and "variant" not in self.cfg.fixed:
            p["variant"] = self.variants[0]
        for k in (*self.space.compile_knobs, *self.space.runtime_knobs):
            if k.name not in self.cfg.fixed:
                p[k.name] = k.default
        return p

    def full_values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        vals = dict(self.baseline_params())
        vals.update(self.cfg.fixed)
        vals.update(params)
        vals.setdefault("variant", self.cfg.fixed.get("variant", self.variants[0]))
        return vals

    # -- evaluation ----------------------------------------------------------------------------

    def _compile_values(self, vals: Mapping[str, Any]) -> dict[str, Any]:
        return {k.name: vals[k.name] for k in self.space.compile_knobs if vals.get(k.name) != k.default}

    def _runtime(self, vals: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
        return runtime_env_and_args(self.space, vals)

    def _build(self, variant: str, compile_values: Mapping[str, Any]) -> Any:
        from tuner.builder.cmake import build_variant
        from tuner.plan.render import render_variant

        rv = render_variant(
            self.source, self.cfg.arch, variant, compile_values=compile_values, local_archs=self._local_archs
        )
        b = build_variant(rv, jobs=self.cfg.jobs)
        if b.cached:
            self.builds_cached += 1
        else:
            self.builds_new += 1
        return rv, b

    def _gate(self, build: Any) -> dict[str, Any]:
        """Correctness gate once per build: test-backend-ops FLASH_ATTN_EXT per selectable kernel."""
        if build.build_id in self._gated:
            return self._gated[build.build_id]
        stored = stored_gate(self.study.get_trials(deepcopy=False), build.build_id)
        if stored is not None:  # a resumed study: this build passed (or failed) the gate in an earlier run
            self._gated[build.build_id] = stored
            return stored
        from tuner.targets.archs import load_arch

        arch = load_arch(self.cfg.arch)
        if not self.cfg.gate or arch.vendor == "cpu":
            res = {"status": "skipped", "why": "CPU backend is the reference test-backend-ops compares against"}
        else:
            from tuner.measure.gate import params_for_model, run_gate

            shape = _model_shape(self.cfg.model)
            kernels = ["VEC", "TILE", "MMA"]
            gate = run_gate(
                build.bin_dir,
                kernels=kernels,
                backend=f"{arch.backend}0",
                params=params_for_model(shape.get("head_dim", 64), "f16"),
                log_dir=self.cfg.run_dir / "logs",
            )
            res = {
                "status": "pass" if gate.passed else "fail",
                "summary": gate.summary,
                "failing": list(gate.failing)[:20],
                "log": str(gate.log_file),
            }
        self._gated[build.build_id] = res
        return res

    def _bench_point(
        self, build: Any, phase: str, depth: int, env: Mapping[str, str], args: Sequence[str], label: str
    ) -> Any:
        from tuner.measure.bench import run_bench

        # -fa is a knob on some spaces, but run_bench owns the flag (its spelling differs by era).
        args = list(args)
        fa = True
        if "-fa" in args:
            i = args.index("-fa")
            fa = args[i + 1] in ("on", "1", "true")
            del args[i : i + 2]
        df = run_bench(
            build.bin_dir,
            self.cfg.model,
            depths=(depth,),
            pp=self.cfg.pp if phase == "pp" else 0,
            tg=self.cfg.tg if phase == "tg" else 0,
            reps=self.cfg.reps,
            target_ci=self.cfg.target_ci,
            max_reps=self.cfg.max_reps,
            env=env,
            extra_args=tuple(args),
            log_dir=self.cfg.run_dir / "logs",
            label=label,
            arch=self.cfg.arch,
            era=self.source.era,
            flash_attn=fa,
        )
        rows = df[df["phase"] == phase]
        if rows.empty or rows.iloc[0].get("status", "ok") != "ok" or not len(rows.iloc[0]["samples"]):
            err = rows.iloc[0].get("error") if not rows.empty else "no row"
            raise TunerError(
                f"llama-bench failed for {phase} at depth {depth}: {err}. Log: {df.attrs.get('log_file')}"
            )
        return rows.iloc[0]

    def _anchor(self) -> dict[str, list[float]]:
        """Re-measure the baseline at every point; store it as an anchor in the study."""
        vals = self.full_values(self.baseline_params())
        _, build = self._build(vals["variant"], {})
        out: dict[str, list[float]] = {}
        for ph, d in self.points:
            row = self._bench_point(build, ph, d, {}, [], "baseline")
            out[point_key(ph, d)] = [float(x) for x in row["samples"]]
            if "device" not in self.study.user_attrs:
                gpu = str(row.get("gpu_info") or "")
                self.study.set_user_attr("device", gpu or f"CPU backend ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)")
                self.study.set_user_attr("toolchain", dict(build.meta.get("toolchain", {})))
        anchors = list(self.study.user_attrs.get("anchors", []))
        anchors.append({"t": time.time(), "samples": out})
        self.study.set_user_attr("anchors", anchors)
        return out

    def baseline_samples(self) -> dict[str, list[float]]:
        """Pooled samples of every anchor so far (drift widens the spread, which is conservative)."""
        pooled: dict[str, list[float]] = {}
        for a in self.study.user_attrs.get("anchors", []):
            for k, v in a["samples"].items():
                pooled.setdefault(k, []).extend(v)
        return pooled

    def evaluate(self, trial: Any) -> tuple[str, float | None]:
        """Run one trial. Returns (state, value); state in complete/fail/pruned."""
        import optuna

        from tuner.plan.space import check_constraints

        vals = self.full_values(trial.params)
        key = stable_hash({k: vals[k] for k in sorted(vals)})
        trial.set_user_attr("params_key", key)
        trial.set_user_attr("values", {k: vals[k] for k in sorted(vals)})

        # Served from the cache: the same point was already measured in this study.
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if t.user_attrs.get("params_key") == key and t.number != trial.number:
                for k in ("samples", "build_id", "env", "args", "gate", "ratios"):
                    if k in t.user_attrs:
                        trial.set_user_attr(k, t.user_attrs[k])
                trial.set_user_attr("cached_from", t.number)
                return "complete", t.value

        compile_values = self._compile_values(vals)
        violations = check_constraints(self.cfg.arch, self.source.era, compile_values, model_shape=_model_shape(self.cfg.model) or None, space=self.space)
        if violations:
            trial.set_user_attr("status", "infeasible")
            trial.set_user_attr("reason", "; ".join(str(v) for v in violations))
            return "fail", None
        try:
            rv, build = self._build(vals["variant"], compile_values)
        except TunerError as err:
            trial.set_user_attr("status", "build_failed")
            trial.set_user_attr("reason", str(err)[:2000])
            return "fail", None
        trial.set_user_attr("build_id", build.build_id)
        trial.set_user_attr("bin_dir", str(build.bin_dir))
        trial.set_user_attr("build_cached", bool(build.cached))
        gate = self._gate(build)
        trial.set_user_attr("gate", gate)
        if gate["status"] == "fail":
            trial.set_user_attr("status", "gate_failed")
            trial.set_user_attr("reason", f"test-backend-ops failed: {gate.get('failing')}")
            return "fail", None

        env, args = self._runtime(vals)
        trial.set_user_attr("env", env)
        trial.set_user_attr("args", args)
        base = self.baseline_samples()
        weights = PROFILES[self.cfg.profile]
        samples: dict[str, list[float]] = {}
        ratios: dict[str, float] = {}
        for step, (ph, d) in enumerate(self.points):
            try:
                row = self._bench_point(build, ph, d, env, args, f"trial{trial.number}")
            except TunerError as err:
                trial.set_user_attr("status", "bench_failed")
                trial.set_user_attr("reason", str(err)[:2000])
                trial.set_user_attr("samples", samples)
                return "fail", None
            k = point_key(ph, d)
            samples[k] = [float(x) for x in row["samples"]]
            ratios[k] = _median(samples[k]) / _median(base[k]) if base.get(k) else float("nan")
            trial.set_user_attr("samples", samples)
            trial.set_user_attr("ratios", ratios)
            if weights.get(ph, 0) > 0 and math.isfinite(ratios[k]):
                trial.report(ratios[k], step)
                if trial.should_prune():
                    trial.set_user_attr("status", "pruned")
                    return "pruned", None
        trial.set_user_attr("status", "ok")
        return "complete", _objective(ratios, weights)

    # -- loop ------------------------------------------------------------------------------------

    def _enqueue_baseline(self) -> None:
        if not self.study.trials:
            self.study.enqueue_trial(self.baseline_params(), user_attrs={BASELINE_PARAMS_ATTR: True})

    def _budget_left(self, started: int) -> bool:
        if self.cfg.time_budget is not None and time.monotonic() - self.t0 > self.cfg.time_budget:
            return False
        if self.cfg.trials is not None:
            import optuna

            done = [
                t
                for t in self.study.get_trials(deepcopy=False)
                if t.state != optuna.trial.TrialState.WAITING
            ]
            # trials counts what the study should reach, so a resumed run finishes the job.
            return len(done) < self.cfg.trials
        return True

    def _reap_dead_local_trials(self) -> None:
        """Fail (and re-enqueue) RUNNING trials whose worker process on this host is gone.

        A ``kill -9`` leaves its trial RUNNING; heartbeats notice that only after the grace period,
        but a process on the same host can tell at once that the owner no longer exists.
        """
        import optuna

        host = platform.node()
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            owner = t.user_attrs.get("worker", "")
            h, _, pid = owner.rpartition(":")
            if h != host or not pid.isdigit() or _pid_alive(int(pid)):
                continue
            self.storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
            self.storage.set_trial_user_attr(t._trial_id, "reason", f"worker {owner} died (killed?) during the trial")
            self.storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
            self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            log.notice(f"trial {t.number} was left RUNNING by {owner}, which is gone: marked FAIL and queued again")

    def loop(self) -> None:
        import optuna

        self._reap_dead_local_trials()
        self._enqueue_baseline()
        if not self.study.user_attrs.get("anchors"):
            with log.step("Measuring the baseline (upstream default) at every point"):
                self._anchor()
        dists = self.distributions()
        started = 0
        since_anchor = 0
        while self._budget_left(started):
            with warnings.catch_warnings():
                # Stale-trial handling is experimental in Optuna 5, and Optuna expects heartbeats
                # only from optimize(); _Heartbeat below records them for our ask/tell loop.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                optuna.storages.fail_stale_trials(self.study)
                trial = self.study.ask(dists)
            trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")
            started += 1
            with _Heartbeat(self.storage, trial._trial_id):
                try:
                    state, value = self.evaluate(trial)
                except TunerError as err:  # anything unexpected but explained: still a FAIL trial
                    trial.set_user_attr("status", "error")
                    trial.set_user_attr("reason", str(err)[:2000])
                    state, value = "fail", None
            if state == "complete":
                self.study.tell(trial, value)
            elif state == "pruned":
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self._progress(trial.number)
            since_anchor += 1
            if since_anchor >= self.cfg.anchor_every and self._budget_left(started):
                self._anchor()
                since_anchor = 0

    def _progress(self, number: int) -> None:
        import optuna

        trials = self.study.get_trials(deepcopy=False)
        t = next(x for x in trials if x.number == number)
        states = [x.state for x in trials]
        n_ok = states.count(optuna.trial.TrialState.COMPLETE)
        n_fail = states.count(optuna.trial.TrialState.FAIL)
        n_pruned = states.count(optuna.trial.TrialState.PRUNED)
        status = t.user_attrs.get("status", t.state.name.lower())
        val = f"{t.value:.3f}x" if t.value is not None else status
        best = ""
        try:
            bt = self.study.best_trial
            best = f" | best #{bt.number} {bt.value:.3f}x"
        except ValueError:
            pass
        why = t.user_attrs.get("reason", "")
        why = f" ({why.splitlines()[0][:120]})" if why and status != "ok" else ""
        log.info(
            f"[trial {number}] {val}{why} | done {n_ok} ok, {n_fail} failed, {n_pruned} pruned | "
            f"builds {self.builds_new} new, {self.builds_cached} cached{best}"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stored_gate(trials: Sequence[Any], build_id: str) -> dict[str, Any] | None:
    """The gate verdict an earlier trial recorded for ``build_id`` (a study is tied to one model, so
    the same build means the same test-backend-ops cases); ``None`` if no trial ran it."""
    for t in trials:
        g = t.user_attrs.get("gate")
        if t.user_attrs.get("build_id") == build_id and isinstance(g, dict) and g.get("status") in ("pass", "fail"):
            return dict(g)
    return None


def _objective(ratios: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Weighted geometric mean of speed ratios vs baseline (1.0 = as fast as upstream)."""
    num = 0.0
    den = 0.0
    for k, r in ratios.items():
        ph, _ = parse_point_key(k)
        w = weights.get(ph, 0.0)
        if w > 0 and r > 0 and math.isfinite(r):
            num += w * math.log(r)
            den += w
    return math.exp(num / den) if den else float("nan")


def _model_shape(model: Path) -> dict[str, int]:
    """Head size, GQA ratio and layer count read from the GGUF (for constraints and the gate)."""
    try:
        from tuner.targets.models import read_shape

        return dict(read_shape(model))
    except (ImportError, AttributeError):
        return {}


