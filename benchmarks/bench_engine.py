"""tidal's engine against transformers' generate on the same requests, in one run.

64 requests of mixed prompt and output lengths (seeded), EOS ignored so every request makes
exactly its output length. tidal gets them all at once (continuous batching); transformers
runs static batches of 32, left-padded, each batch run to its longest output. Prints useful
output tokens/s for both and the ratio.

    python benchmarks/bench_engine.py                      # default model, CPU
    python benchmarks/bench_engine.py --random-llama 1b --device cuda --dtype bfloat16
    python benchmarks/bench_engine.py --skip-transformers --profile   # where tidal's time goes
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import tempfile
import time

import torch
from tqdm import tqdm

RANDOM_LLAMA_SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": (256, 768, 4, 8, 2, 32000),
    "1b": (2048, 8192, 16, 32, 8, 128256),
    "8b": (4096, 14336, 32, 32, 8, 128256),
}


def make_requests(num: int, vocab: int, seed: int, prompt_range, output_range):
    rng = random.Random(seed)
    reqs = []
    for _ in range(num):
        p = rng.randint(*prompt_range)
        o = rng.randint(*output_range)
        reqs.append(([rng.randrange(1000, vocab - 1) for _ in range(p)], o))
    return reqs


def save_random_llama(size: str, out_dir: str, dtype: torch.dtype) -> None:
    import transformers

    hidden, inter, layers, heads, kv, vocab = RANDOM_LLAMA_SHAPES[size]
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=8192,
        rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    with torch.device("cpu"):
        model = transformers.LlamaForCausalLM(cfg).to(dtype)
    model.save_pretrained(out_dir)
    # Prompts are token ids, so a word-level vocabulary of the right size will do.
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(f"{out_dir}/tokenizer.json")
    with open(f"{out_dir}/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)


def run_tidal(
    model: str | None, reqs, device: str, dtype: str, max_num_seqs: int, profile: bool = False
) -> tuple[float, int]:
    from engine import LLM, SamplingParams

    llm = LLM(model=model, device=device, dtype=dtype, max_num_seqs=max_num_seqs,
              max_model_len=2048)  # fmt: skip
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate([reqs[0][0]], warm)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for _, o in reqs]
    if device == "cuda":
        torch.cuda.synchronize()
    profiler = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    outs = llm.generate([p for p, _ in reqs], params, use_tqdm=True)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    assert useful == sum(o for _, o in reqs)
    return elapsed, useful


def run_transformers(model: str | None, reqs, device: str, dtype: torch.dtype, batch: int):
    from transformers import AutoModelForCausalLM

    from engine.default_model import default_model_path

    if model is None:
        path = default_model_path()
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                  dtype=dtype)  # fmt: skip
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    hf = hf.to(device).eval()
    pad = 0

    def gen(batch_reqs):
        width = max(len(p) for p, _ in batch_reqs)
        ids = torch.full((len(batch_reqs), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(batch_reqs):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        longest = max(o for _, o in batch_reqs)
        with torch.no_grad():
            hf.generate(ids.to(device), attention_mask=mask.to(device), do_sample=False,
                        max_new_tokens=longest, min_new_tokens=longest, eos_token_id=None,
                        pad_token_id=pad)  # fmt: skip

    gen(reqs[:1][:1] and [(reqs[0][0], 4)])  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start in tqdm(range(0, len(reqs), batch), desc="transformers", unit="batch"):
        gen(reqs[start : start + batch])
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, sum(o for _, o in reqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--random-llama", choices=sorted(RANDOM_LLAMA_SHAPES), default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-range", type=int, nargs=2, default=(16, 256))
    ap.add_argument("--output-range", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile tidal's run (top 15 ops)")
    args = ap.parse_args()

    torch_dtype = getattr(torch, args.dtype)
    model = None
    vocab = 49152
    if args.random_llama:
        tmp = tempfile.mkdtemp(prefix="tidal-bench-")
        save_random_llama(args.random_llama, tmp, torch_dtype)
        model, vocab = tmp, RANDOM_LLAMA_SHAPES[args.random_llama][5]
    reqs = make_requests(args.num_requests, vocab, args.seed, args.prompt_range, args.output_range)
    t_tidal, useful = run_tidal(
        model, reqs, args.device, args.dtype, args.max_num_seqs, args.profile
    )
    rows = [("tidal (continuous batching)", t_tidal, useful / t_tidal)]
    if not args.skip_transformers:
        t_hf, _ = run_transformers(model, reqs, args.device, torch_dtype, args.hf_batch)
        rows.append(
            (f"transformers generate (static batches of {args.hf_batch})", t_hf, useful / t_hf)
        )
    print(f"\n{args.num_requests} requests, {useful} useful output tokens, "
          f"model={'default (SmolLM2-135M GGUF)' if model is None else args.random_llama}, "
          f"device={args.device}, dtype={args.dtype}")  # fmt: skip
    print(f"{'system':<48} {'wall s':>8} {'useful tok/s':>13}")
    for name, t, rate in rows:
        print(f"{name:<48} {t:>8.2f} {rate:>13.1f}")
    if len(rows) == 2:
        print(f"ratio tidal / transformers: {rows[0][2] / rows[1][2]:.2f}x")


if __name__ == "__main__":
    main()
