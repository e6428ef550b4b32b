"""A fleet of edge boards behind one endpoint, on Ray Serve (docs/fleet.md): this machine's accelerators as Ray
custom resources, planner-driven placement of models on node types, and bundles served as Ray Serve deployments.

Only :mod:`edgeinfer.fleet.ray_serve` and :mod:`edgeinfer.fleet.node` import Ray, inside their functions."""
