"""The warm-up decision of an exported policy, in a process of its own under a memory bound.

Not imported: :func:`harness.deploy.trial_decision` runs this file as a script, ``python -I
deploy_trial.py <address-space bytes> <inputs JSON>``, with the model's bytes on stdin. It caps
its own address space first (``RLIMIT_AS``: an allocation past the bound fails instead of being
made), then loads the model in onnxruntime on one thread and runs it once on zero observations
of the declared inputs, batch 1. It prints ``{"decision_s": ..., "actions_shape": [...]}`` and
exits 0, or exits 1 with the error as the last line on stderr; the caller kills it at its time
bound. It imports only numpy and onnxruntime, so that its start costs a fraction of a second.
"""

import json
import resource
import sys
import time


def main() -> int:
    """Run the trial decision described by ``sys.argv`` on the model read from stdin."""
    address_space, inputs = int(sys.argv[1]), json.loads(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    import numpy as np
    import onnxruntime as ort

    model = sys.stdin.buffer.read()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        feeds = {entry["name"]: np.zeros((1, *entry["shape"]), entry["dtype"])
                 for entry in inputs}
        start = time.perf_counter()
        (actions,) = session.run(["actions"], feeds)
    except Exception as error:  # onnxruntime's own pybind types, MemoryError included
        message = " ".join(str(error).split())
        print(f"{type(error).__name__}: {message}", file=sys.stderr)
        return 1
    print(json.dumps({"decision_s": time.perf_counter() - start,
                      "actions_shape": list(np.shape(actions))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
