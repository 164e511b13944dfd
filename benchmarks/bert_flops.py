#!/usr/bin/env python3
"""FLOPs of one BERT pretraining sequence, and the dense peak FLOP/s of known GPUs, for MFU figures.

Imported by benchmarks/bert_python_peer.py (and other scripts); run alone it prints one JSON line:

    bert_flops.py --config configs/bert-base-uncased.json --seq 128 --masked 20 [--device-name NAME --precision P]

Notation (a bert_config.json): L layers, h hidden_size, I intermediate_size, V vocab_size, S tokens per
sequence, m masked (predicted) positions per sequence. A multiply-add is 2 FLOPs; training is 3x the forward
pass (forward, gradient of the inputs, gradient of the weights).

model_flops_per_sequence (what the model computes, counted per sequence):
    6 S L (4 h^2 + 2 h I)     the encoder's matrix weights, per token: Q, K, V, attention output (4 h^2) and
                              the feed-forward pair (2 h I)
  + 12 L S^2 h                attention scores QK^T and context AV, 2 S^2 h FLOPs each, forward, per layer
  + 6 m (h^2 + h V)           MLM transform and decoder (tied to the word embeddings) at the m masked positions
  + 6 (h^2 + 2 h)             pooler and NSP classifier, one token ([CLS]) per sequence
Embedding lookups, LayerNorm, GELU, softmax, biases and the optimizer are not counted.

flops_6nt_per_sequence (the usual estimate, as if every parameter met every token):
    6 P S + 12 L S^2 h,  P = parameter_count(config), all parameters of BertForPreTraining:
    word V h + position max_position_embeddings h + token type type_vocab_size h + embedding LayerNorm 2 h
    + L (4 h^2 + 4 h  +  2 h I + I + h  +  4 h)     attention, feed-forward, two LayerNorms
    + h^2 + h (pooler) + h^2 + h + 2 h (MLM transform and its LayerNorm) + V (decoder bias) + 2 h + 2 (NSP)
It overstates BERT's work: the word embeddings (V h, most of a small model) are a lookup, and the decoder
runs at the masked positions only.

peak_flops(device_name, precision): dense (no sparsity) peak FLOP/s by a substring of the device's name:
bf16/fp16 the tensor-core figure; fp32 the non-tensor FP32 figure (autocast-free fp32 with PyTorch's default
matmul precision does not use TF32). None for any other device, the CPU included.
"""
import argparse
import json

# (substring of the device name, peak bf16/fp16, peak fp32 non-tensor), FLOP/s, dense; the first match wins,
# so the specific names come before the general ones.
_PEAKS = (
    ("H100 PCIe", 756e12, 51.2e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989.4e12, 66.9e12),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200", 989.4e12, 66.9e12),
    ("A100", 312e12, 19.5e12),
)


def parameter_count(config: dict) -> int:
    """All parameters of BertForPreTraining (the decoder's weight is the word embeddings, counted once)."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    vocab = config["vocab_size"]
    embeddings = (vocab + config["max_position_embeddings"] + config["type_vocab_size"]) * h + 2 * h
    layer = (4 * h * h + 4 * h) + (2 * h * inter + inter + h) + 4 * h
    heads = (h * h + h) + (h * h + h + 2 * h) + vocab + (2 * h + 2)  # pooler, MLM transform, decoder bias, NSP
    return embeddings + layers * layer + heads


def _attention_flops(config: dict, seq: int) -> float:
    return 12.0 * config["num_hidden_layers"] * seq * seq * config["hidden_size"]


def model_flops_per_sequence(config: dict, seq: int, masked: float) -> float:
    """Training FLOPs of one sequence of `seq` tokens with `masked` predicted positions (may be a mean)."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    encoder = 6.0 * seq * layers * (4 * h * h + 2 * h * inter)
    mlm = 6.0 * masked * (h * h + h * config["vocab_size"])
    nsp = 6.0 * (h * h + 2 * h)
    return encoder + _attention_flops(config, seq) + mlm + nsp


def flops_6nt_per_sequence(config: dict, seq: int) -> float:
    """6 P S + 12 L S^2 h: training FLOPs of one sequence by the parameter count."""
    return 6.0 * parameter_count(config) * seq + _attention_flops(config, seq)


def peak_flops(device_name: str, precision: str):
    """Dense peak FLOP/s of `device_name` (e.g. torch.cuda.get_device_name()) at `precision` (fp32, bf16 or
    fp16), or None when the device is not known."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
    for name, half, single in _PEAKS:
        if name in device_name:
            return single if precision == "fp32" else half
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="bert_config.json")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--masked", type=float, default=20, help="masked positions per sequence (a mean is fine)")
    parser.add_argument("--device-name", default="", help="a GPU's name, for its peak FLOP/s")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    print(json.dumps({
        "seq_length": args.seq, "masked_per_sequence": args.masked, "parameters": parameter_count(config),
        "model_flops_per_sequence": model_flops_per_sequence(config, args.seq, args.masked),
        "flops_6nt_per_sequence": flops_6nt_per_sequence(config, args.seq),
        "peak_flops": peak_flops(args.device_name, args.precision) if args.device_name else None}))


if __name__ == "__main__":
    main()
