/* test_hardening.c - reads one built program's ELF and checks its hardening: PIE, full RELRO, a
 * non-executable stack, stack canaries and fortified libc calls (tests/hardening.cmake).
 *
 *   test_hardening [--lib] [--static SOURCE] [--fortify] FILE
 *
 * FILE is a dynamic PIE program unless --lib (a shared object) or --static SOURCE (a static-pie
 * program). Canaries and fortified calls show in a dynamic file as undefined __stack_chk_fail
 * and __*_chk symbols in .dynsym. A static file holds glibc's own copies of those whether or not
 * our code calls them, so there the functions of SOURCE (the local symbols after its STT_FILE
 * entry in .symtab) are scanned for direct calls to them. Exit 0 when every check passes, 1 when
 * one fails, 2 when FILE cannot be read. */
#include <elf.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum kind { PROGRAM, LIBRARY, STATIC };

struct elf {
    const char *path;
    const uint8_t *base;
    size_t size;
    const Elf64_Ehdr *eh;
};

static int failures;

static void check(bool ok, const char *path, const char *what, const char *detail)
{
    printf("%s %s: %s%s%s\n", ok ? "ok  " : "FAIL", path, what, detail[0] ? " - " : "", detail);
    if (!ok)
        failures++;
}

/* A section by index, or NULL when the index or its extent is out of the file. */
static const Elf64_Shdr *section(const struct elf *e, size_t i)
{
    if (i == 0 || i >= e->eh->e_shnum)
        return NULL;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(e->base + e->eh->e_shoff) + i;
    if (sh->sh_type != SHT_NOBITS &&
        (sh->sh_offset > e->size || sh->sh_size > e->size - sh->sh_offset))
        return NULL;
    return sh;
}

static const Elf64_Shdr *section_of_type(const struct elf *e, uint32_t type)
{
    for (size_t i = 1; i < e->eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(e, i);
        if (sh != NULL && sh->sh_type == type)
            return sh;
    }
    return NULL;
}

static const char *str_at(const struct elf *e, const Elf64_Shdr *strtab, size_t off)
{
    if (strtab == NULL || off >= strtab->sh_size)
        return "";
    const char *s = (const char *)e->base + strtab->sh_offset + off;
    return memchr(s, '\0', strtab->sh_size - off) != NULL ? s : "";
}

static bool is_chk_name(const char *n)
{
    size_t l = strlen(n);
    return strncmp(n, "__", 2) == 0 && l > 6 && strcmp(n + l - 4, "_chk") == 0 &&
           strcmp(n, "__stack_chk_fail") != 0;
}

/* Symbols of a symbol table section, with its string table. */
struct syms {
    const Elf64_Sym *sym;
    size_t n;
    const Elf64_Shdr *strtab;
};

static struct syms symbols(const struct elf *e, uint32_t type)
{
    struct syms s = {0};
    const Elf64_Shdr *sh = section_of_type(e, type);
    if (sh == NULL || sh->sh_entsize != sizeof(Elf64_Sym))
        return s;
    s.sym = (const Elf64_Sym *)(e->base + sh->sh_offset);
    s.n = sh->sh_size / sizeof(Elf64_Sym);
    s.strtab = section(e, sh->sh_link);
    return s;
}

/* Undefined .dynsym symbols: the canary failure routine, and (if asked) the fortified functions. */
static void dynamic_calls(const struct elf *e, bool fortify)
{
    struct syms ds = symbols(e, SHT_DYNSYM);
    bool canary = false;
    int chk = 0;
    char names[160] = "";
    for (size_t i = 0; i < ds.n; i++) {
        if (ds.sym[i].st_shndx != SHN_UNDEF)
            continue;
        const char *n = str_at(e, ds.strtab, ds.sym[i].st_name);
        if (strcmp(n, "__stack_chk_fail") == 0)
            canary = true;
        else if (is_chk_name(n) && chk++ < 3)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     chk > 1 ? " " : "", n);
    }
    check(canary, e->path, "stack canaries",
          canary ? "imports __stack_chk_fail"
                 : "no __stack_chk_fail import: built without -fstack-protector-strong?");
    if (!fortify)
        return;
    char d[256];
    snprintf(d, sizeof d, "%d fortified imports (%s%s)", chk, names, chk > 3 ? " ..." : "");
    check(chk > 0, e->path, "fortified libc calls",
          chk > 0 ? d : "no __*_chk import: built without -D_FORTIFY_SOURCE=2 -O2?");
}

/* Is there a direct call or jump from code at addr (its bytes p, n long) to a target? */
static int calls_to(uint16_t machine, const uint8_t *p, size_t n, uint64_t addr,
                    const uint64_t *targets, size_t ntargets)
{
    int found = 0;
    if (machine == EM_X86_64) {
        for (size_t i = 0; i + 5 <= n; i++) {
            if (p[i] != 0xe8 && p[i] != 0xe9) /* call rel32, jmp rel32 (a tail call) */
                continue;
            int32_t rel;
            memcpy(&rel, p + i + 1, 4);
            uint64_t to = addr + i + 5 + (int64_t)rel;
            for (size_t t = 0; t < ntargets; t++)
                found += to == targets[t];
        }
    } else if (machine == EM_AARCH64) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            uint32_t w;
            memcpy(&w, p + i, 4);
            if ((w & 0x7c000000) != 0x14000000) /* B, BL imm26 */
                continue;
            /* imm26, sign-extended, times 4 */
            int64_t off = (int64_t)((int32_t)((w & 0x03ffffff) << 6) >> 4);
            uint64_t to = addr + i + off;
            for (size_t t = 0; t < ntargets; t++)
                found += to == targets[t];
        }
    }
    return found;
}

/* The functions of one source file in a static program, scanned for calls to __stack_chk_fail
 * and (if asked) to __*_chk functions (.symtab: glibc's copies are in the file whether we call them
 * or not). */
static void static_calls(const struct elf *e, const char *source, bool fortify)
{
    uint16_t m = e->eh->e_machine;
    if (m != EM_X86_64 && m != EM_AARCH64) {
        check(false, e->path, "stack canaries",
              "no call scanner for this machine (x86-64 and aarch64 only)");
        return;
    }
    struct syms ss = symbols(e, SHT_SYMTAB);
    if (ss.n == 0) {
        check(false, e->path, "stack canaries",
              "no .symtab: the file is stripped, nothing to scan");
        return;
    }
    uint64_t canary[4], chk[64];
    size_t ncanary = 0, nchk = 0;
    for (size_t i = 0; i < ss.n; i++) {
        const Elf64_Sym *s = &ss.sym[i];
        if (ELF64_ST_TYPE(s->st_info) != STT_FUNC || s->st_shndx == SHN_UNDEF)
            continue;
        const char *n = str_at(e, ss.strtab, s->st_name);
        if (strcmp(n, "__stack_chk_fail") == 0 && ncanary < 4)
            canary[ncanary++] = s->st_value;
        else if (is_chk_name(n) && nchk < 64)
            chk[nchk++] = s->st_value;
    }
    int funcs = 0, with_canary = 0, with_chk = 0;
    bool in = false;
    for (size_t i = 0; i < ss.n; i++) {
        const Elf64_Sym *s = &ss.sym[i];
        if (ELF64_ST_TYPE(s->st_info) == STT_FILE) {
            in = strcmp(str_at(e, ss.strtab, s->st_name), source) == 0;
            continue;
        }
        if (!in || ELF64_ST_TYPE(s->st_info) != STT_FUNC || s->st_size == 0)
            continue;
        const Elf64_Shdr *text = section(e, s->st_shndx);
        if (text == NULL || text->sh_type != SHT_PROGBITS || s->st_value < text->sh_addr ||
            s->st_value - text->sh_addr > text->sh_size ||
            s->st_size > text->sh_size - (s->st_value - text->sh_addr))
            continue;
        const uint8_t *code = e->base + text->sh_offset + (s->st_value - text->sh_addr);
        funcs++;
        with_canary += calls_to(m, code, s->st_size, s->st_value, canary, ncanary) > 0;
        with_chk += calls_to(m, code, s->st_size, s->st_value, chk, nchk) > 0;
    }
    char d[256];
    if (funcs == 0) {
        snprintf(d, sizeof d, "no functions of %s in .symtab (wrong SOURCE?)", source);
        check(false, e->path, "stack canaries", d);
        return;
    }
    snprintf(d, sizeof d, "%d of the %d functions of %s call __stack_chk_fail", with_canary, funcs,
             source);
    check(with_canary > 0, e->path, "stack canaries", d);
    if (!fortify)
        return;
    snprintf(d, sizeof d, "%d of the %d functions of %s call __*_chk functions", with_chk, funcs,
             source);
    check(with_chk > 0, e->path, "fortified libc calls", d);
}

static void run(const struct elf *e, enum kind kind, const char *source, bool fortify)
{
    const Elf64_Ehdr *eh = e->eh;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(e->base + eh->e_phoff);
    bool interp = false, relro = false, nx_stack = false;
    for (size_t i = 0; i < eh->e_phnum; i++) {
        interp |= ph[i].p_type == PT_INTERP;
        relro |= ph[i].p_type == PT_GNU_RELRO;
        if (ph[i].p_type == PT_GNU_STACK)
            nx_stack = (ph[i].p_flags & PF_X) == 0;
    }
    uint64_t flags = 0, flags_1 = 0;
    bool bind_now = false;
    int needed = 0;
    const Elf64_Shdr *dyn = section_of_type(e, SHT_DYNAMIC);
    if (dyn != NULL) {
        const Elf64_Dyn *d = (const Elf64_Dyn *)(e->base + dyn->sh_offset);
        for (size_t i = 0; i < dyn->sh_size / sizeof *d && d[i].d_tag != DT_NULL; i++) {
            flags |= d[i].d_tag == DT_FLAGS ? d[i].d_un.d_val : 0;
            flags_1 |= d[i].d_tag == DT_FLAGS_1 ? d[i].d_un.d_val : 0;
            bind_now |= d[i].d_tag == DT_BIND_NOW;
            needed += d[i].d_tag == DT_NEEDED;
        }
    }
    bind_now |= (flags & DF_BIND_NOW) || (flags_1 & DF_1_NOW);

    const char *p = e->path;
    if (kind == LIBRARY) {
        check(eh->e_type == ET_DYN, p, "shared object",
              eh->e_type == ET_DYN ? "ET_DYN" : "not ET_DYN");
    } else {
        bool pie = eh->e_type == ET_DYN && (flags_1 & DF_1_PIE);
        check(pie, p, "PIE",
              pie                     ? "ET_DYN with DF_1_PIE"
              : eh->e_type == ET_EXEC ? "ET_EXEC: a fixed load address"
                                      : "no DF_1_PIE in DT_FLAGS_1");
    }
    if (kind == STATIC)
        check(!interp && needed == 0, p, "static",
              !interp && needed == 0 ? "no PT_INTERP, no DT_NEEDED"
                                     : "has an ELF interpreter or needs shared libraries");
    else if (kind == PROGRAM)
        check(interp, p, "dynamic program",
              interp ? "PT_INTERP" : "no PT_INTERP: pass --static SOURCE for a static program");
    check(relro, p, "RELRO",
          relro ? "PT_GNU_RELRO" : "no PT_GNU_RELRO segment: link with -z relro");
    check(bind_now, p, "full RELRO (bind now)",
          bind_now ? "DF_BIND_NOW / DF_1_NOW"
                   : "lazy binding leaves the GOT writable: link with -z now");
    check(nx_stack, p, "non-executable stack",
          nx_stack ? "PT_GNU_STACK without PF_X" : "executable or unmarked stack");

    if (kind == STATIC)
        static_calls(e, source, fortify);
    else
        dynamic_calls(e, fortify);
}

int main(int argc, char **argv)
{
    enum kind kind = PROGRAM;
    const char *source = NULL;
    bool fortify = false;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--lib") == 0)
            kind = LIBRARY;
        else if (strcmp(argv[i], "--fortify") == 0)
            fortify = true;
        else if (strcmp(argv[i], "--static") == 0 && i + 1 < argc)
            kind = STATIC, source = argv[++i];
        else
            break;
    }
    if (i != argc - 1) {
        fprintf(stderr, "usage: test_hardening [--lib] [--static SOURCE] [--fortify] FILE\n");
        return 2;
    }
    struct elf e = {.path = argv[i]};
    int fd = open(e.path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        perror(e.path);
        return 2;
    }
    e.size = (size_t)st.st_size;
    void *m = e.size >= sizeof(Elf64_Ehdr) ? mmap(NULL, e.size, PROT_READ, MAP_PRIVATE, fd, 0)
                                           : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "%s: not an ELF file (too short or unreadable)\n", e.path);
        return 2;
    }
    e.base = m;
    e.eh = m;
    if (memcmp(e.eh->e_ident, ELFMAG, SELFMAG) != 0 || e.eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        e.eh->e_shentsize != sizeof(Elf64_Shdr) || e.eh->e_phentsize != sizeof(Elf64_Phdr) ||
        e.eh->e_shoff > e.size || e.eh->e_shnum > (e.size - e.eh->e_shoff) / sizeof(Elf64_Shdr) ||
        e.eh->e_phoff > e.size || e.eh->e_phnum > (e.size - e.eh->e_phoff) / sizeof(Elf64_Phdr)) {
        fprintf(stderr, "%s: not a well-formed 64-bit ELF file\n", e.path);
        return 2;
    }
    run(&e, kind, source, fortify);
    munmap(m, e.size);
    return failures == 0 ? 0 : 1;
}
