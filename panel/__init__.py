"""The web panel (OPS-2): operators watch and steer novels in a browser.

`novelbus panel` / `novelbus up --panel` serve it (Starlette on uvicorn); pages are HTML shells
filled by `static/panel.js` from a small JSON API, kept live by server-sent events fed from the
JetStream event stream. See `panel.app` for routes and guards, `panel.views` for the read model.
"""
