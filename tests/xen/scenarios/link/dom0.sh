# Scenario link: two test hosts whose dom0 NICs share one emulated Ethernet segment.
# Host A (xmx.link=ping) sends MXoE-ethertype frames up to the jumbo size to host B
# (xmx.link=echo), which returns each; both end with the result.
#
# Kernel arguments: xmx.link= ping or echo, xmx.peer= the peer's MAC (ping),
# xmx.nic= the interface (default eth0), xmx.mtu= (default 9000).

# Whole frames, Ethernet header included: the smallest, a standard MTU, a middle, a jumbo.
XMX_LINK_SIZES=60,1514,4014,9014

scenario_dom0() {
    local nic mtu role
    nic=$(xmx_arg nic eth0)
    mtu=$(xmx_arg mtu 9000)
    role=$(xmx_arg link none)
    ip link set lo up
    ip link set "$nic" mtu "$mtu" || { xmx_log "$nic refuses MTU $mtu"; ip link show "$nic"; return $XMX_FAIL; }
    ip link set "$nic" up || return $XMX_SETUP
    ip link show "$nic"
    case $role in
        echo) rawlink echo "$nic" 120 ;;
        ping) rawlink ping "$nic" "$(xmx_arg peer)" "$XMX_LINK_SIZES" 20 120 ;;
        *) xmx_log "xmx.link must be ping or echo, not '$role'"; return $XMX_SETUP ;;
    esac
    case $? in
        0) return $XMX_PASS ;;
        1) return $XMX_FAIL ;;
        *) return $XMX_SETUP ;;
    esac
}
