"""Give an older muestra export the logits_positions input, in place: its graph took the last position's hidden
state with a Slice before the vocabulary projection; a Gather of the positions named by the input takes its
place (default [-1] when a caller names none), so the lm can verify draft tokens with it.

    python -m muestra.lm.export.positions FOLDER

Nothing else in the graph changes: every logit it gave before, it gives again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx

from muestra.lm.export.errors import ExportError
from muestra.lm.export.families import LOGITS_POSITIONS


def add_logits_positions(model: onnx.ModelProto) -> bool:
    """Replace the Slice that keeps the last position before the logits with a Gather of logits_positions;
    False when the graph has the input already."""
    graph = model.graph
    if any(i.name == LOGITS_POSITIONS for i in graph.input):
        return False
    producers = {out: node for node in graph.node for out in node.output}
    name, node = "logits", None
    for _ in range(8):  # Cast, MatMul(NBits), Slice: the Slice is a few nodes up from the output
        node = producers.get(name)
        if node is None or node.op_type == "Slice":
            break
        name = node.input[0]
    if node is None or node.op_type != "Slice":
        raise ExportError("the graph has no Slice before its logits: it gives every position's logits already?")
    gather = onnx.helper.make_node(
        "Gather", [node.input[0], LOGITS_POSITIONS], list(node.output), name="/model/LogitsPositions", axis=1
    )
    index = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(index, gather)
    graph.input.append(onnx.helper.make_tensor_value_info(LOGITS_POSITIONS, onnx.TensorProto.INT64, ["kept"]))
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].dim_param = "kept"
    return True


def upgrade_folder(folder: Path) -> bool:
    path = folder / "model.onnx"
    model = onnx.load(str(path))
    if not add_logits_positions(model):
        return False
    onnx.save_model(model, str(path))
    metadata_path = folder / "muestra_export.json"
    if metadata_path.is_file():
        metadata = json.loads(metadata_path.read_text())
        metadata["logits"] = "positions"
        metadata_path.write_text(json.dumps(metadata, indent=2) + "\n")
    return True


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {'upgraded' if upgrade_folder(Path(arg)) else 'has logits_positions already'}")
