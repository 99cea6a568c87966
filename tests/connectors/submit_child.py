"""One submit in a process of its own, for the crash test (tests/connectors/test_contract.py):

    python -m tests.connectors.submit_child '{"connector": {...}, "op_key": "...", "request": {...}}'

Prints ``ready`` once its connector is built and ``answered <Outcome>`` once submit returns, then waits to be killed.
"""

import json
import sys
import time

from tests.connectors.specs import connector_from_spec

if __name__ == "__main__":
    order = json.loads(sys.argv[1])
    connector = connector_from_spec(order["connector"])
    print("ready", flush=True)
    outcome = connector.submit(order["op_key"], order["request"])
    print(f"answered {type(outcome).__name__}", flush=True)
    time.sleep(60)
