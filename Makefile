# Build and install xmx.
#
#   make                      cargo build --release (the whole workspace), and the
#                             library's Open-MX name libopen-mx.so.0 beside it
#   make install              install what `make` built; honours DESTDIR and PREFIX
#   make uninstall            remove exactly what `make install` installs
#   make test                 install the Debian packages the tests need when missing
#                             (.ci/deps), then run every test binary of the workspace
#
# `install` does not build: run `make` first (or point BUILD_DIR at another cargo profile,
# e.g. BUILD_DIR=target/debug). xmx-frontd (the guest daemon) is installed when it was built.

PREFIX         ?= /usr/local
DESTDIR        ?=
BINDIR         ?= $(PREFIX)/bin
SBINDIR        ?= $(PREFIX)/sbin
LIBDIR         ?= $(PREFIX)/lib
INCLUDEDIR     ?= $(PREFIX)/include
PKGCONFIGDIR   ?= $(LIBDIR)/pkgconfig
SYSCONFDIR     ?= /etc
XENSCRIPTDIR   ?= $(SYSCONFDIR)/xen/scripts
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
CARGO          ?= cargo
BUILD_DIR      ?= target/release
INSTALL        ?= install

VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)
LIB     := libmyriexpress.so
# The library's SONAME is libmyriexpress.so (libmx/build.rs), as MX's own: the runtime
# loader looks for that name; the versioned file and the .so.0 link are for packaging.
LIBFILE := $(LIB).$(VERSION)
# Binaries linked against Open-MX record libopen-mx.so.0: the same library
# under that name (and libopen-mx.so for linking, open-mx.pc for pkg-config).
OMXLIB  := libopen-mx.so

DAEMONS  := xmxd xmx-backd xmx-simhv
OPTIONAL := $(notdir $(wildcard $(BUILD_DIR)/xmx-frontd))
HEADERS  := $(notdir $(wildcard libmx/include/*.h))
HOOKS    := xmx-hook vif-xmx
UNITS    := xmxd.service xmx-backd.service

D = $(DESTDIR)

.PHONY: all install uninstall check-built test

all:
	$(CARGO) build --release --workspace
	ln -sf $(LIB) "$(BUILD_DIR)/$(OMXLIB).0"

# --no-fail-fast: a failing test binary does not hide the verdicts of the others.
test:
	.ci/deps
	$(CARGO) test --workspace --no-fail-fast

check-built:
	@for f in xmx $(DAEMONS) $(LIB); do \
	    test -f "$(BUILD_DIR)/$$f" || { echo "$(BUILD_DIR)/$$f is missing: run make first" >&2; exit 1; }; \
	done

install: check-built
	$(INSTALL) -d "$(D)$(BINDIR)" "$(D)$(SBINDIR)" "$(D)$(LIBDIR)" "$(D)$(INCLUDEDIR)" \
	    "$(D)$(PKGCONFIGDIR)" "$(D)$(XENSCRIPTDIR)" "$(D)$(SYSTEMDUNITDIR)" "$(D)$(SYSCONFDIR)/default"
	$(INSTALL) -m 755 "$(BUILD_DIR)/xmx" "$(D)$(BINDIR)/xmx"
	for b in $(DAEMONS) $(OPTIONAL); do $(INSTALL) -m 755 "$(BUILD_DIR)/$$b" "$(D)$(SBINDIR)/$$b" || exit 1; done
	$(INSTALL) -m 755 "$(BUILD_DIR)/$(LIB)" "$(D)$(LIBDIR)/$(LIBFILE)"
	ln -sf "$(LIBFILE)" "$(D)$(LIBDIR)/$(LIB).0"
	ln -sf "$(LIBFILE)" "$(D)$(LIBDIR)/$(LIB)"
	ln -sf "$(LIBFILE)" "$(D)$(LIBDIR)/$(OMXLIB).0"
	ln -sf "$(LIBFILE)" "$(D)$(LIBDIR)/$(OMXLIB)"
	for h in $(HEADERS); do $(INSTALL) -m 644 "libmx/include/$$h" "$(D)$(INCLUDEDIR)/$$h" || exit 1; done
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	    'Name: libmyriexpress' \
	    'Description: The MX (Myrinet Express) API over xmx' \
	    'Version: $(VERSION)' \
	    'Libs: -L$${libdir} -lmyriexpress' \
	    'Cflags: -I$${includedir}' > "$(D)$(PKGCONFIGDIR)/libmyriexpress.pc"
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	    'Name: open-mx' \
	    'Description: The MX (Myrinet Express) API over xmx, under Open-MX'"'"'s library name' \
	    'Version: $(VERSION)' \
	    'Libs: -L$${libdir} -lopen-mx' \
	    'Cflags: -I$${includedir}' > "$(D)$(PKGCONFIGDIR)/open-mx.pc"
	chmod 644 "$(D)$(PKGCONFIGDIR)/libmyriexpress.pc" "$(D)$(PKGCONFIGDIR)/open-mx.pc"
	for h in $(HOOKS); do $(INSTALL) -m 755 "dom0-tools/hooks/$$h" "$(D)$(XENSCRIPTDIR)/$$h" || exit 1; done
	for u in $(UNITS); do \
	    sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
	        "dom0-tools/systemd/$$u.in" > "$(D)$(SYSTEMDUNITDIR)/$$u" || exit 1; \
	    chmod 644 "$(D)$(SYSTEMDUNITDIR)/$$u"; \
	done
	$(INSTALL) -m 644 dom0-tools/systemd/xmx.default "$(D)$(SYSCONFDIR)/default/xmx"

uninstall:
	rm -f "$(D)$(BINDIR)/xmx"
	for b in $(DAEMONS) xmx-frontd; do rm -f "$(D)$(SBINDIR)/$$b"; done
	rm -f "$(D)$(LIBDIR)/$(LIBFILE)" "$(D)$(LIBDIR)/$(LIB).0" "$(D)$(LIBDIR)/$(LIB)"
	rm -f "$(D)$(LIBDIR)/$(OMXLIB).0" "$(D)$(LIBDIR)/$(OMXLIB)"
	for h in $(HEADERS); do rm -f "$(D)$(INCLUDEDIR)/$$h"; done
	rm -f "$(D)$(PKGCONFIGDIR)/libmyriexpress.pc" "$(D)$(PKGCONFIGDIR)/open-mx.pc"
	for h in $(HOOKS); do rm -f "$(D)$(XENSCRIPTDIR)/$$h"; done
	for u in $(UNITS); do rm -f "$(D)$(SYSTEMDUNITDIR)/$$u"; done
	rm -f "$(D)$(SYSCONFDIR)/default/xmx"
