#!/usr/bin/env python3
"""Lab stand-in for the GLM-5-NVFP4 model directory (no GPU here; the real one is ~400 GB).

    stand_in_model.py DIR

Writes, once, a directory shaped like a Hugging Face model snapshot: config.json (GLM-5's architecture name and
model type, tiny sizes), generation_config.json, a BPE tokenizer trained here with the `tokenizers` library
(tokenizer.json, tokenizer_config.json with a chat template, loadable by transformers' AutoTokenizer, so
sglang.bench_serving counts real tokens), and a tiny model.safetensors in the real format (header + one F32
tensor). DIR/.glm5-stand-in names what it is; DIR/SHA256SUMS (sha256sum's format) is the list of sums a user keeps
with a staged model (sglang_model checks the staged copy against it). Deterministic: the same bytes every time; an
existing complete directory is left alone ("unchanged"). DIR must not exist, be empty, or be such a stand-in
already: a folder that holds anything else (a real snapshot named by mistake) is refused, nothing written. It is built
in DIR.partial and renamed when whole.
"""
import hashlib
import json
import os
import shutil
import struct
import sys

WORDS = ('the of and to in is was for on that with as by at from this be are or an it which one all were can '
         'there has had have not but their more also its into two than other time new some first these may such '
         'only after about most over city water system number people world state year three model node server '
         'token batch memory power cache kernel driver engine answer question paris france capital rome berlin '
         'madrid london tokyo sum product plus minus times equals result value test check every day light fast '
         'slow large small high low open close start stop read write load save send keep find give take make').split()
SPECIAL = ['<|endoftext|>', '<|user|>', '<|assistant|>', '<|system|>']
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def corpus():
    lines = []
    for i, w in enumerate(WORDS):
        lines.append(' '.join(WORDS[(i * k) % len(WORDS)] for k in range(1, 13)))
        lines.append('{0} {1} + {2} = {3}, {1} * {2} = {4}.'.format(w, i, i * 3 + 7, i + i * 3 + 7, i * (i * 3 + 7)))
    lines.append('What is the capital of France? The capital of France is Paris.')
    lines.append('0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 42 100 1000')
    return lines


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def safetensors_bytes():
    data = struct.pack('<16f', *[float(i) / 16 for i in range(16)])
    header = json.dumps({'lm_head.weight': {'dtype': 'F32', 'shape': [4, 4], 'data_offsets': [0, len(data)]},
                         '__metadata__': {'format': 'pt', 'glm5_lab': 'stand-in'}}, separators=(',', ':'))
    header += ' ' * (-len(header) % 8)
    return struct.pack('<Q', len(header)) + header.encode() + data


def write_sums(out):
    """SHA256SUMS, as `sha256sum` writes it, of every file but itself."""
    lines = []
    for top, dirs, files in os.walk(out):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(top, name), out)
            if rel != 'SHA256SUMS':
                with open(os.path.join(top, name), 'rb') as fh:
                    lines.append('{0}  {1}\n'.format(hashlib.sha256(fh.read()).hexdigest(), rel))
    with open(os.path.join(out, 'SHA256SUMS'), 'w') as fh:
        fh.writelines(lines)


def main(argv):
    if argv in (['-h'], ['--help']):
        print(__doc__.strip())
        return 0
    if len(argv) != 1 or argv[0].startswith('-'):
        raise SystemExit('usage: stand_in_model.py DIR')
    final = argv[0].rstrip('/') or '/'
    marker = os.path.join(final, '.glm5-stand-in')
    if os.path.exists(marker):
        if not os.path.exists(os.path.join(final, 'SHA256SUMS')):    # staged by an older version of this script
            write_sums(final)
        print('unchanged')
        return 0
    # Never over what is not its own: a folder that holds anything (a real snapshot given by mistake) is refused
    if os.path.lexists(final) and not (os.path.isdir(final) and not os.listdir(final)):
        raise SystemExit('stand_in_model.py: {0} {1} and is not a stand-in model (no .glm5-stand-in): nothing was '
                         'written'.format(final, 'holds files' if os.path.isdir(final) else 'is not a folder'))
    # built beside it and renamed when whole: a build cut short leaves only DIR.partial (made again next time)
    out = final + '.partial'
    if os.path.isdir(out) and not os.path.islink(out):
        shutil.rmtree(out)
    os.makedirs(out)
    tok = tokenizer()
    tok.save(os.path.join(out, 'tokenizer.json'))
    files = {
        'config.json': {'architectures': ['GlmMoeDsaForCausalLM'], 'model_type': 'glm_moe_dsa', 'hidden_size': 4,
                        'num_hidden_layers': 1, 'num_attention_heads': 1, 'vocab_size': tok.get_vocab_size(),
                        'max_position_embeddings': 4096, 'torch_dtype': 'bfloat16',
                        'eos_token_id': tok.token_to_id('<|endoftext|>'), 'glm5_lab_stand_in': True},
        'generation_config.json': {'eos_token_id': tok.token_to_id('<|endoftext|>'), 'temperature': 1.0},
        'tokenizer_config.json': {'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '<|endoftext|>',
                                  'pad_token': '<|endoftext|>', 'model_max_length': 4096,
                                  'chat_template': CHAT_TEMPLATE},
        'special_tokens_map.json': {'eos_token': '<|endoftext|>', 'pad_token': '<|endoftext|>'},
    }
    for name, content in files.items():
        with open(os.path.join(out, name), 'w') as fh:
            json.dump(content, fh, indent=2, sort_keys=True)
            fh.write('\n')
    with open(os.path.join(out, 'model.safetensors'), 'wb') as fh:
        fh.write(safetensors_bytes())
    with open(os.path.join(out, '.glm5-stand-in'), 'w') as fh:
        fh.write('glm5 lab stand-in for GLM-5-NVFP4 (scripts/lab/stand_in_model.py): no weights that compute\n')
    write_sums(out)
    if os.path.isdir(final):
        os.rmdir(final)             # empty (checked above)
    os.rename(out, final)
    print('built')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
