"""The ceiling for bench_serve.py: plain FastAPI + uvicorn (one worker) around the same HuggyAgent,
the same request parsing and answer encoding as the served API, no batching.

    .venv/bin/python bench/fastapi_ceiling.py PORT
"""

import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from deploy.serving.parsing import parse_act_request
from deploy.serving.responses import ApiError, act_response
from huggy_agent import HuggyAgent

agent = HuggyAgent(device="cpu")
app = FastAPI()


@app.post("/v1/act")
async def act(request: Request) -> Response:
    try:
        parsed = parse_act_request(await request.body(), agent.spec, 256)
    except ApiError as error:
        return Response(error.body(), status_code=error.status, media_type="application/json")
    actions = agent.actions_from(agent.distribution(parsed.obs), parsed.deterministic,
                                 parsed.seed, parsed.row_offset)
    return Response(act_response({"continuous": actions}, parsed.single, agent.fingerprint),
                    media_type="application/json")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                access_log=False)
