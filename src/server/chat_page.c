/* The chat page served at GET /: src/server/chat_page.html, embedded in the binary at build time by the
 * assembler's .incbin (no generated source file, no tool beyond the compiler). The Makefile makes this object
 * depend on the HTML file. The symbols are hidden: they are not part of libdsv4.so's API. The page is kept as
 * a real .html file so it can be edited and opened directly. */
#include <stddef.h>

__asm__(".section .rodata\n"
        ".global server_chat_page\n"
        ".hidden server_chat_page\n"
        ".type server_chat_page, @object\n"
        ".balign 16\n"
        "server_chat_page:\n"
        ".incbin \"src/server/chat_page.html\"\n"
        "server_chat_page_end:\n"
        ".byte 0\n"
        ".global server_chat_page_len\n"
        ".hidden server_chat_page_len\n"
        ".type server_chat_page_len, @object\n"
        ".balign 4\n"
        "server_chat_page_len:\n"
        ".long server_chat_page_end - server_chat_page\n"
        ".previous\n");
