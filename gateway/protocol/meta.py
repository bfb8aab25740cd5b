"""Reserved names: `_meta` keys (spec: basic/index §_meta) and extension identifiers."""

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
PROGRESS_TOKEN = "progressToken"

# `capabilities.extensions` keys (SEP-2663: Tasks).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
