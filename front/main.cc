// wsup-front: the data plane. See front/front.h.
#include "front/front.h"

int main(int argc, char** argv) { return wsup::front::FrontMain(argc, argv); }
