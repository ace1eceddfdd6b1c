#include <cstdio>
int toy_tile();
int toy_rows();
int main() {
    std::printf("{\"tile\": %d, \"rows\": %d}\n", toy_tile(), toy_rows());
    return 0;
}
