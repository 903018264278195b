"""Application services shared by the command line and the web panel: what a novel-steering
command does (`actions`) and the capability probes with their report cache (`probe`).

Above the actors, below both front ends (`cli/`, `panel/`), so neither front end imports the other's
internals to reuse them.
"""
