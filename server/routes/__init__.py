"""The app's own routes, one `APIRouter` per concern (create_app includes them in order):
episodes (reset, step, verify, state, close, the batch calls), catalog (families, packs,
tasks, sampler), publishing (publish, download, enable, yank), tokens and operations
(healthz, readyz, metrics). Each reaches the front with `manager_of(request)` and the
shared parts with `services_of(request)` (server/caller.py)."""
