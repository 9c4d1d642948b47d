"""The node tools behind ``runc-guardctl``: discovery, sweep, audit, metrics,
containerd config. They may use the delete path's seams, never the CLI.
"""
