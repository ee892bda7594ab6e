"""The ASGI entry `./scripts/run` starts: the Streamlit app (app.py) plus the pipeline API at /api/v1.

`streamlit run serve.py` finds `app` (an `st.App`) and serves it with uvicorn in this process, so one
port answers both the pages and `/api/v1` (OpenAPI docs at `/api/v1/docs`). The launcher
`lib.ui.server` keeps deep links on the router as before.
"""

from pathlib import Path

import streamlit as st
from starlette.routing import Mount

from lib.api import API_PREFIX, create_app

app = st.App(str(Path(__file__).resolve().parent / "app.py"), routes=[Mount(API_PREFIX, app=create_app())])
