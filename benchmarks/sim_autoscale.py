"""Replay a day of arrivals through KEDA's and the HPA's replica logic with tidal's settings.

    python benchmarks/sim_autoscale.py                      # table + benchmarks/results/*.png
    python benchmarks/sim_autoscale.py --measure-cpu        # measure the real engine on CPU

The ScaledObject's numbers come from ``infra.keda.ScalingSettings`` (the same object that
renders the manifest), the prod overlay's maxReplicaCount, and the soft-shutdown timeout of
``infra/k8s/base/config.yaml``. Mechanics modelled, at one-second steps:

- KEDA (every ``pollingInterval``): composite = queued + in flight, with the high-lane/in-flight
  bump of the formula; active when composite > activationTarget; 0 -> 1 on activation,
  1 -> 0 after ``cooldownPeriod`` without activity.
- HPA (every 15 s, replicas >= 1): desired = ceil(composite / target), 10% tolerance,
  scale-up limited to max(+8 pods, x2) per 60 s, scale-down to the highest recommendation of
  the last 300 s and to -50% per 60 s; clamped to [1, maxReplicaCount].
- Pods: ready ``node_provision_s + cold_start_s`` after creation (GPU-time counts from
  creation); ``concurrency`` slots, one kept for the high lane; each busy slot generates
  ``tokens_per_s / concurrency`` tokens/s. A removed pod finishes chunks that need at most the
  soft-shutdown timeout and hands the others back (their progress is lost; counted).
- Scheduled warm-up: one tiny high-lane message at the cron time.

Inputs that are measurements carry their source in ``--help``; the GPU price is an assumption.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.keda import ScalingSettings  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DAY_S = 24 * 3600
HPA_SYNC_S = 15
HPA_TOLERANCE = 0.1


def prod_settings() -> tuple[ScalingSettings, float, int]:
    """ScalingSettings with the prod overlay's max, the soft-shutdown timeout, concurrency."""
    prod = yaml.safe_load((ROOT / "infra/k8s/overlays/prod/patch-scaledobject.yaml").read_text())
    config = yaml.safe_load((ROOT / "infra/k8s/base/config.yaml").read_text())["data"]
    settings = replace(ScalingSettings(), max_replicas=prod["spec"]["maxReplicaCount"])
    return (
        settings,
        float(config["TIDAL_SOFT_SHUTDOWN_TIMEOUT_S"]),
        int(config["TIDAL_CONCURRENCY"]),
    )


@dataclass(frozen=True)
class Trace:
    """Arrivals of one day: (time_s, lane, tokens) sorted by time."""

    times_s: np.ndarray
    is_high: np.ndarray
    tokens: np.ndarray


def make_trace(seed: int, peak_chunks_per_s: float, tokens_per_chunk: int) -> Trace:
    """Daily cycle (quiet night, 08:00-18:00 plateau with a lunch dip), three bulk bursts,
    and a high-lane stream of single requests at 5% of the normal-lane message rate."""
    rng = np.random.default_rng(seed)
    t = np.arange(DAY_S)
    hour = t / 3600
    # ~1 chunk per 10 min at night; business hours start sharply at 08:00.
    shape = np.interp(
        hour,
        [0, 7.95, 8, 12, 13, 14, 18, 21, 22, 24],
        [2e-3, 2e-3, 1, 1, 0.7, 1, 1, 0.2, 2e-3, 2e-3],
    )
    normal_t = t[rng.random(DAY_S) < peak_chunks_per_s * shape]
    bursts = [(10.5, 300), (14.0, 500), (20.0, 200)]  # (hour, chunks submitted at once)
    burst_t = np.concatenate([np.full(n, int(h * 3600)) for h, n in bursts])
    high_t = t[rng.random(DAY_S) < 0.05 * peak_chunks_per_s * shape]
    times = np.concatenate([normal_t, burst_t, high_t]).astype(float)
    is_high = np.concatenate(
        [np.zeros(len(normal_t) + len(burst_t), bool), np.ones(len(high_t), bool)]
    )
    tokens = np.where(is_high, tokens_per_chunk // 64, tokens_per_chunk)
    order = np.argsort(times, kind="stable")
    return Trace(times[order], is_high[order], tokens[order])


@dataclass
class Pod:
    created_s: float
    ready_s: float
    slots: list = field(default_factory=list)  # [remaining_tokens, is_high, arrival_s]


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens_per_s: float
    cold_start_s: float
    node_provision_s: float = 0.0
    warmup_at_s: float | None = None
    warmup_messages: int = 1  # tidal beat sends one warm-up task on the high lane
    fixed_replicas: int | None = None  # an always-on fleet: no autoscaling
    normal_activation: int | None = None  # override of the ScaledObject's activation


def simulate(sc: Scenario, trace: Trace, s: ScalingSettings, soft_s: float, conc: int) -> dict:
    """Run one scenario; returns waits, GPU-seconds, counters and a per-minute timeline."""
    if sc.normal_activation is not None:
        s = replace(s, normal_activation=sc.normal_activation)
    queues = {True: deque(), False: deque()}  # lane is_high -> [(arrival_s, tokens)]
    arrivals = list(zip(trace.times_s, trace.is_high, trace.tokens, strict=True))
    if sc.warmup_at_s is not None:
        arrivals += [(sc.warmup_at_s, True, 4)] * sc.warmup_messages
        arrivals.sort(key=lambda a: a[0])
    pods: list[Pod] = []
    replicas = sc.fixed_replicas or 0
    history: deque = deque([(0.0, replicas)], maxlen=400)
    recommendations: deque = deque(maxlen=400)
    last_active_s = -1e9
    waits = {True: [], False: []}
    gpu_s = tokens_done = num_requeued = 0.0
    timeline = []
    slot_rate = sc.tokens_per_s / conc
    i, now = 0, 0.0
    end_s = DAY_S + 6 * 3600
    for step in tqdm(range(int(end_s)), desc=sc.name, leave=False, mininterval=2):
        now = float(step)
        while i < len(arrivals) and arrivals[i][0] <= now:
            _, high, tokens = arrivals[i]
            queues[bool(high)].append((arrivals[i][0], float(tokens)))
            i += 1
        inflight = sum(len(p.slots) for p in pods)
        queued = len(queues[True]) + len(queues[False])
        urgent = len(queues[True]) + inflight
        total = queued + inflight
        composite = (
            s.normal_activation + 1 if urgent > 0 and total <= s.normal_activation else total
        )
        if sc.fixed_replicas is None and step % s.polling_interval_s == 0:
            active = composite > s.normal_activation
            if active:
                last_active_s = now
                replicas = max(replicas, 1)
            elif replicas > 0 and now - last_active_s >= s.cooldown_period_s:
                replicas = 0
        if sc.fixed_replicas is None and replicas >= 1 and step % HPA_SYNC_S == 0:
            ratio = composite / (s.target_per_replica * replicas)
            desired = (
                replicas
                if abs(1 - ratio) <= HPA_TOLERANCE
                else math.ceil(composite / s.target_per_replica)
            )
            recommendations.append((now, desired))
            base = next((r for t, r in reversed(history) if t <= now - 60), history[0][1])
            if desired > replicas:
                limit = max(
                    base + s.scale_up_pods_per_min, base * (1 + s.scale_up_percent_per_min / 100)
                )
                new = min(desired, int(limit))
            else:
                window = [r for t, r in recommendations if t > now - s.scale_down_stabilization_s]
                limit = math.ceil(base * (1 - s.scale_down_percent_per_min / 100))
                new = max(max(window), limit)
            replicas = max(1, min(s.max_replicas, new))
        history.append((now, replicas))
        while len(pods) < replicas:
            pods.append(Pod(now, now + sc.node_provision_s + sc.cold_start_s))
        while len(pods) > replicas:
            # ReplicaSet order: not-ready pods first, then the youngest.
            victim = max(pods, key=lambda p: (p.ready_s > now, p.created_s))
            pods.remove(victim)
            for slot in victim.slots:
                if slot[0] <= slot_rate * soft_s:  # finishes inside the soft shutdown
                    tokens_done += slot[3]
                    gpu_s += slot[0] / slot_rate
                else:
                    queues[slot[1]].appendleft((slot[2], slot[3]))
                    num_requeued += 1
        for pod in pods:
            gpu_s += 1.0
            if pod.ready_s > now:
                continue
            for slot in pod.slots:
                slot[0] -= slot_rate
            done = [sl for sl in pod.slots if sl[0] <= 0]
            tokens_done += sum(sl[3] for sl in done)
            pod.slots = [sl for sl in pod.slots if sl[0] > 0]
            while len(pod.slots) < conc and (queues[True] or queues[False]):
                num_normal = sum(1 for sl in pod.slots if not sl[1])
                high = bool(queues[True])
                if not high and num_normal >= conc - 1:
                    break  # the last slot is kept for the high lane
                arrival_s, tokens = queues[high].popleft()
                waits[high].append((arrival_s, now - arrival_s))
                pod.slots.append([tokens, high, arrival_s, tokens])
        if step % 60 == 0:
            ready = sum(1 for p in pods if p.ready_s <= now)
            timeline.append((now, queued, inflight, len(pods), ready))
        if now >= DAY_S and i == len(arrivals) and total == 0 and (sc.fixed_replicas or not pods):
            break
    return {
        "waits": waits,
        "gpu_h": gpu_s / 3600,
        "tokens": tokens_done,
        "requeued": num_requeued,
        "timeline": np.array(timeline),
    }


def measure_cpu() -> None:
    """Cold start (fresh process to first token) and batch throughput of the real engine."""
    import subprocess

    code = (
        "import time; t0=time.monotonic()\n"
        "from engine.llm import LLM; from engine.sampling_params import SamplingParams\n"
        "llm=LLM(device='cpu'); t_load=time.monotonic()-t0\n"
        "llm.generate(['Hello'], SamplingParams(max_tokens=4, temperature=0))\n"
        "t_first=time.monotonic()-t0\n"
        "ps=[f'Write a short note about topic number {i}.' for i in range(32)]\n"
        "sp=SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)\n"
        "t1=time.monotonic(); outs=llm.generate(ps, sp); dt=time.monotonic()-t1\n"
        "n=sum(len(o.outputs[0].token_ids) for o in outs)\n"
        "print(f'loaded {t_load:.1f} s, first token {t_first:.1f} s, {n} tokens in {dt:.1f} s'"
        " f' = {n/dt:.2f} tokens/s at batch 32')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure-cpu", action="store_true", help="measure the engine on CPU")
    parser.add_argument(
        "--tokens-per-s", type=float, default=725.0,
        help="per-worker output tokens/s; default: transformers continuous batching, "
        "Llama-3-8B shape on one H200, measured (shared/ANCHORS.md), a floor for tidal's engine",
    )  # fmt: skip
    parser.add_argument(
        "--fast-tokens-per-s", type=float, default=4132.0,
        help="second throughput: vLLM 0.6.0, Llama-3.1-8B, one A100 (published, ANCHORS.md)",
    )  # fmt: skip
    parser.add_argument(
        "--cold-start-s", type=float, default=18.5,
        help="process start to first token, 8B bf16 on the H200 machine (measured, ANCHORS.md)",
    )  # fmt: skip
    parser.add_argument("--node-provision-s", type=float, default=180.0, help="assumption")
    parser.add_argument("--gpu-hour-usd", type=float, default=4.0, help="assumption")
    parser.add_argument("--peak-chunks-per-s", type=float, default=0.8)
    parser.add_argument("--tokens-per-chunk", type=int, default=64 * 256)
    parser.add_argument("--warmup-hour", type=float, default=7 + 55 / 60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.measure_cpu:
        measure_cpu()
        return

    settings, soft_s, conc = prod_settings()
    trace = make_trace(args.seed, args.peak_chunks_per_s, args.tokens_per_chunk)
    peak_tok_s = max(
        trace.tokens[(trace.times_s >= h * 300) & (trace.times_s < (h + 1) * 300)].sum() / 300
        for h in range(DAY_S // 300)
    )
    warm = args.warmup_hour * 3600
    node_s = args.node_provision_s
    scenarios = []
    cold = args.cold_start_s
    for tok_s in (args.tokens_per_s, args.fast_tokens_per_s):
        peak_fleet = min(settings.max_replicas, math.ceil(peak_tok_s / tok_s))
        at = f"@{tok_s:.0f} tok/s"
        scenarios += [
            Scenario(f"always-on {peak_fleet} {at}", tok_s, cold, fixed_replicas=peak_fleet),
            Scenario(f"KEDA {at}", tok_s, args.cold_start_s),
            Scenario(f"KEDA, normal activation 2 {at}", tok_s, cold, normal_activation=2),
            Scenario(f"KEDA + warm-up x1 {at}", tok_s, args.cold_start_s, warmup_at_s=warm),
            Scenario(f"KEDA, node +{node_s:.0f}s {at}", tok_s, args.cold_start_s, node_s),
            Scenario(f"KEDA, node +{node_s:.0f}s, warm-up x1 {at}", tok_s, cold, node_s, warm),
            Scenario(
                f"KEDA, node +{node_s:.0f}s, warm-up x{settings.target_per_replica * 8} {at}",
                tok_s, args.cold_start_s, node_s, warm, settings.target_per_replica * 8,
            ),
        ]  # fmt: skip
    results = {
        sc.name: simulate(sc, trace, settings, soft_s, conc)
        for sc in tqdm(scenarios, desc="scenarios")
    }

    print(f"trace: {len(trace.times_s)} messages, {trace.tokens.sum() / 1e6:.1f} M tokens, "
          f"peak 5-min demand {peak_tok_s:,.0f} tokens/s; settings {settings}")  # fmt: skip
    print(
        "| scenario | normal wait p50 / p99 / max | 08:00-09:00 normal p99 | high wait p50 / p99 "
        "| GPU-hours | $ / M tokens | chunks requeued |\n|---|---|---|---|---|---|---|"
    )
    for name, r in results.items():
        normal = [w for _, w in r["waits"][False]]
        morning = [w for a, w in r["waits"][False] if 8 * 3600 <= a < 9 * 3600]
        high = [w for _, w in r["waits"][True]]
        cost = r["gpu_h"] * args.gpu_hour_usd / (r["tokens"] / 1e6)
        print(
            f"| {name} | {percentile(normal, 50):,.0f} / {percentile(normal, 99):,.0f} / "
            f"{max(normal):,.0f} s | {percentile(morning, 99):,.0f} s "
            f"| {percentile(high, 50):,.0f} / {percentile(high, 99):,.0f} s "
            f"| {r['gpu_h']:,.1f} | {cost:.2f} | {r['requeued']:.0f} |"
        )
    plot(
        results,
        [scenarios[0].name, scenarios[1].name, scenarios[6].name],
        RESULTS / "sim_autoscale.png",
    )


def plot(results: dict, names: list[str], path: Path) -> None:
    """Queue depth and pods over the day for the named scenarios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name in names:
        tl = results[name]["timeline"]
        hours = tl[:, 0] / 3600
        axes[0].plot(hours, tl[:, 1], label=name, lw=1)
        axes[1].plot(hours, tl[:, 3], label=name, lw=1)
    axes[0].set_ylabel("queued messages")
    axes[0].set_yscale("symlog")
    axes[1].set_ylabel("worker pods (GPUs)")
    axes[1].set_xlabel("hour of day")
    axes[0].legend(fontsize=8)
    axes[0].set_title("tidal autoscaling simulation (benchmarks/sim_autoscale.py)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
