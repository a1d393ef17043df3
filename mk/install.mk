# Installing dsv4 as a C library and a program (issue 19), included by the Makefile. Kept in its own file so the
# main build rules stay as they are:
#
#   make lib        build/libdsv4.so.X.Y.Z (soname libdsv4.so.X) from position-independent objects in build/pic/
#                   (part of a plain `make` too)
#   make install    PREFIX (default /usr/local) and DESTDIR honoured; see INSTALLED for the list
#   make uninstall  removes exactly INSTALLED (and, in a DESTDIR staging tree, the folders left empty)
#   make examples   build/examples/*: the programs in examples/, compiled against include/ only
#
# The CUDA build (make CUDA=1, BUILD=build-cuda) installs the same way: its nvcc objects (CU_OBJ) go into libdsv4.a
# through the Makefile's rule, and PIC copies of them (CU_PIC_OBJ, built here with -Xcompiler -fPIC) into
# libdsv4.so; its libraries come in LDLIBS, which links both the binary and libdsv4.so and, minus the ones with a
# .pc of their own, becomes dsv4.pc's Libs.private.

# ---- version: include/dsv4.h is the one place it is written ------------------------------------------------------
version_part = $(shell sed -n 's/^\#define DSV4_VERSION_$(1) \([0-9][0-9]*\)$$/\1/p' include/dsv4.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION_MINOR := $(call version_part,MINOR)
VERSION_PATCH := $(call version_part,PATCH)
VERSION       := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
SO_NAME       := libdsv4.so.$(VERSION_MAJOR)
SO_REAL       := libdsv4.so.$(VERSION)

# The commit baked into `dsv4 --version` and into saved state files: 12 hex digits, "-dirty" with uncommitted
# changes, "unknown" outside a git checkout (a release tarball). Packagers may pass GIT_COMMIT=... themselves.
# (Whether CUDA is built in, and the CPU features, version.c reads from the compiler's own macros.)
GIT_COMMIT ?= $(shell [ -e .git ] && c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && \
                { git diff --quiet HEAD -- 2>/dev/null || c=$$c-dirty; } && echo $$c || echo unknown)

# build_info.h is rewritten only when its content changes, so a new commit recompiles one file and relinks.
$(BUILD)/gen/build_info.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define DSV4_BUILD_COMMIT "%s"\n' '$(GIT_COMMIT)' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi
FORCE:

VERSION_OBJ := $(BUILD)/src/util/version.o $(BUILD)/pic/src/util/version.o
$(VERSION_OBJ): $(BUILD)/gen/build_info.h
$(VERSION_OBJ): CFLAGS += -I$(BUILD)/gen

# ---- the libraries -----------------------------------------------------------------------------------------------
# Library objects export only what include/dsv4.h marks DSV4_API. Hidden visibility changes nothing for static
# linking (the tests use internal functions through libdsv4.a), but it keeps libdsv4.a's internals private when
# someone links it into a shared object of their own.
PIC_OBJ := $(LIB_SRC:%.c=$(BUILD)/pic/%.o) $(ISA_PIC_OBJ)
CU_PIC_OBJ := $(CU_OBJ:$(BUILD)/%=$(BUILD)/pic/%)
$(LIB_OBJ): CFLAGS += -fvisibility=hidden

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@

$(BUILD)/pic/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc -MMD -MP -c $< -o $@

# --no-undefined: every symbol must come from the objects or the listed libraries (a missing -l fails here, not
# in a user's program); --exclude-libs: static archives pulled in (cudart_static) are not re-exported. A shared
# library links its dependencies as shared libraries, also under STATIC_DEPS=1 (whose -Wl,-Bstatic is for the
# binary: Debian's libjansson.a is not position-independent).
comma := ,
SO_LDLIBS := $(filter-out -Wl$(comma)-Bstatic -Wl$(comma)-Bdynamic,$(LDLIBS))
$(BUILD)/$(SO_REAL): $(PIC_OBJ) $(CU_PIC_OBJ)
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(SO_NAME) -Wl,--no-undefined -Wl,--exclude-libs,ALL -o $@ $^ $(SO_LDLIBS)
	ln -sf $(SO_REAL) $(BUILD)/$(SO_NAME)
	ln -sf $(SO_NAME) $(BUILD)/libdsv4.so

.PHONY: lib install uninstall examples FORCE
lib: $(BUILD)/libdsv4.a $(BUILD)/$(SO_REAL)
# A plain `make` builds the shared library too, so that `make && sudo make install` compiles nothing as root.
# Sanitizer, CUDA (nvcc twice would double the GPU loop) and STATIC_DEPS builds leave it to `make lib` / `install`.
ifeq ($(strip $(SAN))$(filter 1,$(CUDA) $(STATIC_DEPS)),)
all: $(BUILD)/$(SO_REAL)
endif

# ---- install / uninstall -----------------------------------------------------------------------------------------
PREFIX       ?= /usr/local
DESTDIR      ?=
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL      ?= install

INSTALLED := $(BINDIR)/dsv4 $(LIBDIR)/libdsv4.a $(LIBDIR)/$(SO_REAL) $(LIBDIR)/$(SO_NAME) $(LIBDIR)/libdsv4.so \
             $(INCLUDEDIR)/dsv4.h $(PKGCONFIGDIR)/dsv4.pc $(MANDIR)/man1/dsv4.1
# Deepest first, for uninstall.
INSTALL_DIRS := $(MANDIR)/man1 $(MANDIR) $(PKGCONFIGDIR) $(LIBDIR) $(INCLUDEDIR) $(BINDIR) $(PREFIX)/share $(PREFIX)

# The private link line of the static library, for dsv4.pc: the libraries with a .pc file of their own go to
# Requires.private, the rest of LDLIBS (-lm -pthread, and the CUDA runtime in a CUDA build) to Libs.private.
# libmicrohttpd stays a plain -l in Libs.private: its own .pc would pull GnuTLS's static closure (libunistring)
# into `pkg-config --static`, and only the server objects, which programs using dsv4.h never link, need it
PC_REQUIRES_PRIVATE := jansson libpcre2-8 libxxhash
PC_LIBS_PRIVATE     := $(filter-out -lgnutls -ljansson -lpcre2-8 -lxxhash -Wl$(comma)-Bstatic -Wl$(comma)-Bdynamic,$(LDLIBS))

install: $(BUILD)/dsv4 $(BUILD)/libdsv4.a $(BUILD)/$(SO_REAL)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(MANDIR)/man1
	$(INSTALL) -m 0755 $(BUILD)/dsv4 $(DESTDIR)$(BINDIR)/dsv4
	$(INSTALL) -m 0644 $(BUILD)/libdsv4.a $(DESTDIR)$(LIBDIR)/libdsv4.a
	$(INSTALL) -m 0755 $(BUILD)/$(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_REAL)
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_NAME)
	ln -sf $(SO_NAME) $(DESTDIR)$(LIBDIR)/libdsv4.so
	$(INSTALL) -m 0644 include/dsv4.h $(DESTDIR)$(INCLUDEDIR)/dsv4.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@VERSION@|$(VERSION)|g' -e 's|@REQUIRES_PRIVATE@|$(PC_REQUIRES_PRIVATE)|g' \
	    -e 's|@LIBS_PRIVATE@|$(strip $(PC_LIBS_PRIVATE))|g' dsv4.pc.in >$(BUILD)/dsv4.pc
	$(INSTALL) -m 0644 $(BUILD)/dsv4.pc $(DESTDIR)$(PKGCONFIGDIR)/dsv4.pc
	sed -e 's|@VERSION@|$(VERSION)|g' docs/dsv4.1 >$(BUILD)/dsv4.1
	$(INSTALL) -m 0644 $(BUILD)/dsv4.1 $(DESTDIR)$(MANDIR)/man1/dsv4.1

# Files only. Folders are removed (when empty) only in a DESTDIR staging tree: on a live system /usr/local/bin and
# the like belong to everyone.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	$(if $(DESTDIR),for d in $(addprefix $(DESTDIR),$(INSTALL_DIRS)); do \
	    [ -d "$$d" ] && rmdir --ignore-fail-on-non-empty "$$d"; done; true)

# ---- examples: public API only (no -Isrc), strict C11 ------------------------------------------------------------
EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
EXAMPLE_CFLAGS := -std=c11 -pedantic $(OPT) -g -Wall -Wextra -Wshadow -Wstrict-prototypes -Iinclude $(SAN)
examples: $(EXAMPLE_BIN)
$(BUILD)/examples/%: examples/%.c include/dsv4.h $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< $(BUILD)/libdsv4.a $(LDLIBS)

-include $(PIC_OBJ:.o=.d) $(CU_PIC_OBJ:.o=.d)
