"""Generate the Python stubs under proto/ from the .proto files (or check they are current).

python scripts/gen_proto.py           # regenerate
python scripts/gen_proto.py --check   # exit 1 if the committed stubs are stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"
PACKAGE = Path("muestra") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def generated_files(root: Path) -> dict[str, Path]:
    return {p.name: p for p in (root / PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = generated_files(Path(tmp))
        current = generated_files(PROTO_ROOT)
        if args.check:
            stale = sorted(
                set(fresh) ^ set(current)
                | {n for n in fresh.keys() & current.keys() if not filecmp.cmp(fresh[n], current[n], shallow=False)}
            )
            if stale:
                print("stale generated stubs (run `make proto`):", ", ".join(stale), file=sys.stderr)
                return 1
            print(f"proto stubs are current ({len(fresh)} files)")
            return 0
        for name in set(current) - set(fresh):
            current[name].unlink()
        for name, path in fresh.items():
            shutil.copyfile(path, PROTO_ROOT / PACKAGE / name)
        print(f"wrote {len(fresh)} files to {PROTO_ROOT / PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
