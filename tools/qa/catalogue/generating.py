"""Generation's mistakes: models whose forward takes no decoding step, whose step cannot be
traced or computes something else than their forward, `--generate`'s options, and `pipecompile
generate`'s prompts, options and directories (damaged stage files among them). The base
``gpt`` is examples/gpt.py compiled into out/ with ``--generate``
(2 stages; 128 tokens of vocabulary, 32 positions)."""

from __future__ import annotations

from catalogue.case import COMPILE, Case, edit, nothing, truncate, write

GEN = ("generate", "out", "-q")
ONE = (*GEN, "--prompt-ids", "1,2,3")
GPT = ("gpt.py", "--stages", "2", "-q", "-o", "gen")

CASES = [
    Case("generate-mlp", "compiled the MLP example with --generate", nothing,
         (*COMPILE, "--generate", "-o", "gen"),
         r"MLP\.forward takes no cache \(or past_key_values\), position_ids, attention_mask "
         r"keyword: --generate traces the model's decoding step with a KV cache.*give the "
         r"forward these keywords, or compile without --generate"),
    Case("generate-bidirectional", "--generate on a GPT whose attention sees later tokens",
         edit("gpt.py", "is_causal=True", "is_causal=False"), (*GPT, "--generate"),
         r"--generate: the traced GPT decoding stages' logits differ from the eager model's at "
         r"position \d+ .*max \|diff\| .*its step with a KV cache does not compute what its "
         r"forward does.*compile without --generate",
         base="gpt"),
    Case("generate-step-untraceable", "--generate on a GPT whose cached attention reads a "
         "tensor's value in Python", edit("gpt.py", "k, v = cache.update(k, v, layer)",
                                          "k, v = cache.update(k, v, layer)\n"
                                          "            if float(k.sum()) > 1e9:\n"
                                          "                k = k * 2"),
         (*GPT, "--generate"),
         r"--generate cannot trace GPT's (prefill|decode) step: .*gpt\.py, line \d+: if "
         r"float\(k\.sum\(\)\) > 1e9:\); compile without --generate",
         base="gpt"),
    Case("generate-cache-unused", "--generate on a GPT whose attention never writes the cache",
         edit("gpt.py", "k, v = cache.update(k, v, layer)", "pass"), (*GPT, "--generate"),
         r"GPT wrote no KV cache of layers 0\.\.N-1 through its cache keyword \(it wrote "
         r"layers \[\]\): its attention must call cache\.update\(key, value, layer_idx\)",
         base="gpt"),
    Case("generate-max-length-past-positions", "--generate --max-length 64 where GPT embeds 32",
         nothing, (*GPT, "--generate", "--max-length", "64"),
         r"--max-length 64 is past the 32 positions GPT embeds \(its config\): give --max-length "
         r"32 or less",
         base="gpt"),
    Case("generate-lanes-zero", "--generate --lanes 0", nothing,
         (*GPT, "--generate", "--lanes", "0"),
         r"argument --lanes: '0' is not a whole number of at least 1", base="gpt"),
    Case("generate-cache-without-generate", "--max-length without --generate", nothing,
         (*GPT, "--max-length", "16"), r"--max-length without --generate: add --generate",
         base="gpt"),
    Case("generate-no-plan", "generate on a directory compiled without --generate", nothing,
         ("generate", "out", "--prompt-ids", "1"),
         r"out was compiled without --generate.*recompile with --generate"),
    Case("generate-prompt-past-cache", "a prompt of 40 tokens, the cache holding 32",
         nothing, (*GEN, "--prompt-ids", ",".join(["7"] * 40)),
         r"prompt 0 has 40 tokens, but the KV cache holds 32 positions \(--max-length 32 at "
         r"compile\): shorten it", base="gpt"),
    Case("generate-too-many-new", "--max-new-tokens past --max-length", nothing,
         (*ONE, "--max-new-tokens", "40"),
         r"--max-new-tokens 40 is past --max-length 32: prompt 0 has 3 tokens, so at most 29 "
         r"new ones fit", base="gpt"),
    Case("generate-eos-out-of-vocabulary", "--eos 999 with a vocabulary of 128", nothing,
         (*ONE, "--eos", "999"), r"--eos 999 is not a token of the model's vocabulary of 128",
         base="gpt"),
    Case("generate-token-out-of-vocabulary", "a prompt with token id 500", nothing,
         (*GEN, "--prompt-ids", "1,500"),
         r"prompt 0 holds token id 500, outside the model's vocabulary of 128", base="gpt"),
    Case("generate-empty-prompt", "--prompt-ids ''", nothing, (*GEN, "--prompt-ids", ""),
         r"prompt 0 is empty: give it at least one token", base="gpt"),
    Case("generate-not-ids", "--prompt-ids 1,x", nothing, (*GEN, "--prompt-ids", "1,x"),
         r"'1,x' is not token ids .*--prompt TEXT", base="gpt"),
    Case("generate-text-without-tokenizer", "--prompt TEXT for a model with no tokenizer",
         nothing, (*GEN, "--prompt", "hello"),
         r"--prompt 'hello' is text, and there is no tokenizer: pass --tokenizer DIR", base="gpt"),
    Case("generate-prompts-file-missing", "--prompts naming a file that is not there", nothing,
         (*GEN, "--prompts", "prompts.txt"), r"--prompts prompts\.txt: cannot read it",
         base="gpt"),
    Case("generate-prompts-file-line", "--prompts FILE whose third line is text",
         write("prompts.txt", "1,2\n3\nhello there\n"), (*GEN, "--prompts", "prompts.txt"),
         r"prompts\.txt:3 is text, and there is no tokenizer", base="gpt"),
    Case("generate-no-prompts", "generate without a prompt", nothing, GEN,
         r"no prompts given: pass --prompt-ids IDS or --prompts FILE", base="gpt"),
    Case("generate-nproc-not-stages", "--nproc 3 for 2 stages", nothing, (*ONE, "--nproc", "3"),
         r"--nproc 3: generation runs one rank per stage, and out has 2 stage\(s\): give "
         r"--nproc 2", base="gpt"),
    Case("generate-temperature", "--temperature -1", nothing, (*ONE, "--temperature", "-1"),
         r"--temperature -1\.0: give 0 \(greedy\) or a finite number above 0", base="gpt"),
    Case("generate-top-p", "--top-p 0", nothing, (*ONE, "--top-p", "0"),
         r"--top-p 0\.0: give a probability in \(0, 1\]", base="gpt"),
    Case("generate-top-k", "--top-k 0", nothing, (*ONE, "--top-k", "0"),
         r"--top-k 0: give 1 or more", base="gpt"),
    Case("generate-train-state-not-a-run", "--train-state naming a directory no run saved",
         write("ck/notes.txt", "hi"), (*ONE, "--train-state", "ck"),
         r"ck holds no train state \(no 'latest' file\); pass a --save directory", base="gpt"),
    Case("generate-record-damaged", "out/manifest.json's generate record edited by hand",
         edit("out/manifest.json", '"lanes": 2', '"lanes": "two"'), ONE,
         r"out/manifest\.json.*generate.*recompile", base="gpt"),
    Case("generate-stage-file-damaged", "out/decode_stage_1.py cut short",
         truncate("out/decode_stage_1.py", 0.5), ONE,
         r"out/decode_stage_1\.py was changed since the compile \(its sha256 is not the "
         r"manifest's\): recompile with --generate",
         base="gpt"),
    Case("generate-weights-truncated", "out/stage_1.safetensors cut short",
         truncate("out/stage_1.safetensors", 0.5), ONE,
         r"stage 1: weights out/stage_1\.safetensors are damaged or truncated", base="gpt"),
]  # fmt: skip

GENERATING = CASES
