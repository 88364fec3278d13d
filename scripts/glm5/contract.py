"""What glm5 relies on in the node and the gateway that no role variable states (their contracts themselves are
sglang_service's sglang_service_contract and sglang_gateway's sglang_gateway_contract, read through glm5.inventory:
Inventory.contract)."""
from __future__ import annotations

# The engine's lock holder, as the run_lock role (sglang_service's tasks/lock.yml) writes it into the lock unit's
# description (roles/run_lock/vars/main.yml: __run_lock_argv) and parses it back ('@<host> pid <pid> ') to take over a
# lock left by a run that is gone
LOCK_DESCRIPTION = '{what} from {user}@{host} pid {pid} since {since}'
# The SGLang environment's manifest (version, profile, patches), next to the venv's bin/ (the unit's python): written
# by sglang_env
MANIFEST = 'glm5-manifest.json'
# The gateway's control plane key in its environment file (sglang_gateway's templates/smg.env.j2): glm5 reads it there,
# in the gateway's container, for each request it makes to the control plane
GATEWAY_ADMIN_KEY_VAR = 'SMG_ADMIN_KEY'
