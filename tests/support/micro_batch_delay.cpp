#include "support/micro_batch_delay.h"

#include <chrono>
#include <fstream>
#include <thread>
#include <utility>

namespace hetseq::test {

std::function<void()> micro_batch_delay(std::string file) {
  return [file = std::move(file)] {
    std::ifstream in(file);
    double ms = 0;
    if (in >> ms && ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  };
}

}  // namespace hetseq::test
