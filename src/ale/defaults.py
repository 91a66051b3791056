"""Defaults that several layers and the CLI share, each written once."""

TOOLS_REPO = "ale-tools"
DEFAULT_TOOLS_IMAGE = f"{TOOLS_REPO}:latest"  # the sandbox image `ale image build` tags
CANDIDATE_USER = "1000:1000"  # the numeric uid:gid the agent's commands run as
# The after-run probes' uid: one the candidate never had, so that nothing it left can
# signal, trace or write into them (they run only once its processes are dead).
PROBE_USER = "65533:65533"
PROBE_UID = 65533
DESKTOP_UID = 1001  # the desktop and its apps (desktop sandboxes only): the agent's shell cannot reach them
DEFAULT_INPUT_DIR = "/input"  # where a task that names no paths finds its input
DEFAULT_OUTPUT_DIR = "/workspace"  # ... and its workspace
# The candidate's HOME: the image's home folder sits on the read-only root, and tools
# that keep settings there (LibreOffice, R's user library, pip's cache, matplotlib)
# fail without a writable one; /tmp is the sandbox's own writable, size-capped place.
CANDIDATE_HOME = "/tmp"
