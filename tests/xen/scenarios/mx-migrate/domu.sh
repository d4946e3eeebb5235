# Scenario mx-migrate, the guest half: the same as mx's (see ../mx/domu.sh), whose job
# loop uses relative xenstore paths and so follows the guest to another host.
. /etc/xmx/scenarios/mx/domu.sh
