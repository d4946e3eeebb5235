# Scenario mx-link, the guest half: the same as mx's (see ../mx/domu.sh).
. /etc/xmx/scenarios/mx/domu.sh
